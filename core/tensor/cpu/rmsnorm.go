package cpu

import "math"

// RMSNormForward computes, for each of rows rows of x [rows, cols],
//
//	rstd = 1 / sqrt(mean(x²) + eps),  y = x * rstd * w
//
// (Llama's RMSNorm: no mean subtracted, no bias) and writes rstd (length
// rows) for RMSNormBackward. The sum of squares runs in float64.
func RMSNormForward[T Float](x, w, y, rstd []T, rows, cols int, eps float64) {
	checkRows("RMSNormForward", rows, cols, []int{len(x), len(y)}, []int{len(rstd)}, []int{len(w)})
	if rows == 0 || cols == 0 {
		return
	}
	ParallelFor(rows, max(1, elemGrain/(2*cols)), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			xs, ys := x[r*cols:(r+1)*cols], y[r*cols:(r+1)*cols]
			var ss float64
			for _, v := range xs {
				ss += float64(v) * float64(v)
			}
			s := 1 / math.Sqrt(ss/float64(cols)+eps)
			rstd[r] = T(s)
			for c, v := range xs {
				ys[c] = T(float64(v)*s) * w[c]
			}
		}
	})
}

// RMSNormBackward accumulates the gradients of RMSNormForward given dy:
//
//	g = dy * w,  xhat = x * rstd
//	dx += rstd * (g - xhat * mean(g * xhat))
//	dw += sum over rows of dy * xhat
//
// Rows run in parallel; dw's column sums go through fixed blocks of rows
// combined in order, so it is bitwise the same for every thread count.
func RMSNormBackward[T Float](dy, x, w, rstd, dx, dw []T, rows, cols int) {
	checkRows("RMSNormBackward", rows, cols, []int{len(dy), len(x), len(dx)}, []int{len(rstd)}, []int{len(w), len(dw)})
	if rows == 0 || cols == 0 {
		return
	}
	nblk := (rows + rowBlock - 1) / rowBlock
	part := getBuf[T](nblk * cols)
	defer putBuf(part)
	ParallelFor(nblk, 1, func(lo, hi int) {
		for blk := lo; blk < hi; blk++ {
			pw := (*part)[blk*cols : (blk+1)*cols]
			clear(pw)
			for r := blk * rowBlock; r < min(rows, (blk+1)*rowBlock); r++ {
				dys, xs, dxs := dy[r*cols:(r+1)*cols], x[r*cols:(r+1)*cols], dx[r*cols:(r+1)*cols]
				s := float64(rstd[r])
				var dot float64
				for c, v := range xs {
					dot += float64(dys[c]) * float64(w[c]) * float64(v) * s
				}
				m := dot / float64(cols)
				for c, v := range xs {
					xh := float64(v) * s
					dxs[c] += T(s * (float64(dys[c])*float64(w[c]) - xh*m))
					pw[c] += T(float64(dys[c]) * xh)
				}
			}
		}
	})
	sumBlocks(*part, nblk, cols, dw)
}
