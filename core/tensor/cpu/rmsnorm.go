package cpu

import "math"

// RMSNormForward computes, for each of rows rows of x [rows, cols],
//
//	rstd = 1 / sqrt(mean(x²) + eps),  y = x * rstd * w
//
// (Llama's RMSNorm: no mean subtracted, no bias) and writes rstd (length
// rows) for RMSNormBackward. In float64 the sum of squares runs in one
// chain; in float32 in sumLanes partial sums combined in a fixed order,
// as LayerNorm's, in C in the cgo build (the Go loops of rmsNormFwd32Go
// operation for operation).
func RMSNormForward[T Float](x, w, y, rstd []T, rows, cols int, eps float64) {
	checkRows("RMSNormForward", rows, cols, []int{len(x), len(y)}, []int{len(rstd)}, []int{len(w)})
	if rows == 0 || cols == 0 {
		return
	}
	ParallelFor(rows, max(1, elemGrain/(2*cols)), func(lo, hi int) {
		if isF32[T]() {
			rmsNormFwd32(as32(x[lo*cols:hi*cols]), as32(w), as32(y[lo*cols:hi*cols]), as32(rstd[lo:hi]), cols, float32(eps))
			return
		}
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
// float32 runs in float32, mean(g * xhat) in sumLanes partial sums
// (rmsNormBwd32Go, in C in the cgo build); float64 in float64.
func RMSNormBackward[T Float](dy, x, w, rstd, dx, dw []T, rows, cols int) {
	checkRows("RMSNormBackward", rows, cols, []int{len(dy), len(x), len(dx)}, []int{len(rstd)}, []int{len(w), len(dw)})
	if rows == 0 || cols == 0 {
		return
	}
	rmsNormBackward(dy, x, halfRows{}, w, rstd, dx, dw, rows, cols)
}

// RMSNormBackwardHalf is RMSNormBackward on x held as 2-byte bits, fp16
// when f16 and bfloat16 otherwise (an activation stored in 2 bytes for
// the backward): each block of rows is widened exactly into a scratch
// buffer, in cache, just before the kernel reads it, so the result is
// bitwise that on the widened x without a float32 copy of all of it.
func RMSNormBackwardHalf(f16 bool, dy []float32, x []uint16, w, rstd, dx, dw []float32, rows, cols int) {
	checkRows("RMSNormBackwardHalf", rows, cols, []int{len(dy), len(x), len(dx)}, []int{len(rstd)}, []int{len(w), len(dw)})
	rmsNormBackward(dy, nil, halfRowsOf(f16, x), w, rstd, dx, dw, rows, cols)
}

// rmsNormBackward is the backward on x, or on xh (float32 only) when x
// is nil.
func rmsNormBackward[T Float](dy, x []T, xh halfRows, w, rstd, dx, dw []T, rows, cols int) {
	if rows == 0 || cols == 0 {
		return
	}
	nblk := (rows + rowBlock - 1) / rowBlock
	part := getBuf[T](nblk * cols)
	defer putBuf(part)
	ParallelFor(nblk, 1, func(lo, hi int) {
		var wide *[]float32 // this chunk's widened rows of xh
		if x == nil {
			wide = getBuf[float32](rowBlock * cols)
			defer putBuf(wide)
		}
		for blk := lo; blk < hi; blk++ {
			pw := (*part)[blk*cols : (blk+1)*cols]
			clear(pw)
			if isF32[T]() {
				r0, r1 := blk*rowBlock, min(rows, (blk+1)*rowBlock)
				var xs []float32
				if x != nil {
					xs = as32(x[r0*cols : r1*cols])
				} else {
					xs = (*wide)[:(r1-r0)*cols]
					xh.widen(xs, xh.h[r0*cols:r1*cols])
				}
				rmsNormBwd32(as32(dy[r0*cols:r1*cols]), xs, as32(w), as32(rstd[r0:r1]), as32(dx[r0*cols:r1*cols]), as32(pw), cols)
				continue
			}
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

// rmsNormFwd32Go is RMSNormForward on the len(rstd) rows of x in float32:
// the sum of squares in sumLanes partial sums combined by reduceLanes,
// the reciprocal square root in float64.
func rmsNormFwd32Go(x, w, y, rstd []float32, cols int, eps float32) {
	w = w[:cols]
	full := cols - cols%sumLanes
	for r := range rstd {
		xr, yr := x[r*cols:(r+1)*cols], y[r*cols:(r+1)*cols]
		var acc [sumLanes]float32
		for i := 0; i < full; i += sumLanes {
			for j := range acc {
				v := xr[i+j]
				acc[j] += v * v
			}
		}
		for i := full; i < cols; i++ {
			v := xr[i]
			acc[i-full] += v * v
		}
		rs := float32(1 / math.Sqrt(float64(reduceLanes(&acc)/float32(cols)+eps)))
		for i, v := range xr {
			yr[i] = v * rs * w[i]
		}
		rstd[r] = rs
	}
}

// rmsNormBwd32Go adds the len(rstd) rows' gradients to dx and their
// contributions to dw into pw, in float32.
func rmsNormBwd32Go(dy, x, w, rstd, dx, pw []float32, cols int) {
	w, pw = w[:cols], pw[:cols]
	full := cols - cols%sumLanes
	for r := range rstd {
		dys, xs, dxs := dy[r*cols:(r+1)*cols], x[r*cols:(r+1)*cols], dx[r*cols:(r+1)*cols]
		s := rstd[r]
		var acc [sumLanes]float32
		for i := 0; i < full; i += sumLanes {
			for j := range acc {
				acc[j] += dys[i+j] * w[i+j] * (xs[i+j] * s)
			}
		}
		for i := full; i < cols; i++ {
			acc[i-full] += dys[i] * w[i] * (xs[i] * s)
		}
		m := reduceLanes(&acc) / float32(cols)
		for c, v := range xs {
			xh := v * s
			dxs[c] += s * (dys[c]*w[c] - xh*m)
			pw[c] += dys[c] * xh
		}
	}
}
