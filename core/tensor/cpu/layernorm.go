package cpu

import (
	"fmt"
	"math"
)

// rowBlock is the number of rows whose parameter-gradient contributions
// are summed together before blocks are combined. Fixing it (rather than
// giving each thread one partial sum) makes dw and db independent of the
// thread count, so runs reproduce bitwise on any machine.
const rowBlock = 32

func checkRows(op string, rows, cols int, full []int, perRow []int, perCol []int) {
	if rows < 0 || cols < 0 {
		panic(fmt.Sprintf("cpu.%s: negative shape %dx%d", op, rows, cols))
	}
	for i, n := range full {
		if n < rows*cols {
			panic(fmt.Sprintf("cpu.%s: matrix argument %d has %d elements, need rows*cols = %d*%d = %d", op, i+1, n, rows, cols, rows*cols))
		}
	}
	for i, n := range perRow {
		if n < rows {
			panic(fmt.Sprintf("cpu.%s: per-row argument %d has %d elements, need rows = %d", op, i+1, n, rows))
		}
	}
	for i, n := range perCol {
		if n < cols {
			panic(fmt.Sprintf("cpu.%s: per-column argument %d has %d elements, need cols = %d", op, i+1, n, cols))
		}
	}
}

// LayerNormForward normalises each row of the rows x cols matrix x to zero
// mean and unit variance (biased variance, eps added inside the square
// root), then applies the per-column scale w and shift b:
//
//	y = (x - mean) * rstd * w + b,  rstd = 1/sqrt(var + eps).
//
// mean and rstd (length rows) are written for LayerNormBackward. The mean
// and variance use two passes over the row, which stays accurate when the
// row's mean is large compared to its spread.
func LayerNormForward[T Float](x, w, b, y, mean, rstd []T, rows, cols int, eps T) {
	checkRows("LayerNormForward", rows, cols, []int{len(x), len(y)}, []int{len(mean), len(rstd)}, []int{len(w), len(b)})
	if rows == 0 || cols == 0 {
		return
	}
	ParallelFor(rows, max(1, elemGrain/(4*cols)), func(lo, hi int) {
		xs, ys := x[lo*cols:hi*cols], y[lo*cols:hi*cols]
		if isF32[T]() {
			layerNormFwd32(as32(xs), as32(w), as32(b), as32(ys), as32(mean[lo:hi]), as32(rstd[lo:hi]), cols, float32(eps))
			return
		}
		layerNormFwdGo(xs, w, b, ys, mean[lo:hi], rstd[lo:hi], cols, eps)
	})
}

// LayerNormBackward accumulates the gradients of LayerNormForward given dy:
//
//	xhat = (x - mean) * rstd,  g = dy * w
//	dx  += (g - mean(g) - xhat * mean(g * xhat)) * rstd
//	dw  += sum over rows of dy * xhat,  db += sum over rows of dy.
//
// Rows are processed in parallel; the column sums go through fixed blocks
// of rows combined in order, so dw and db are bitwise the same for every
// thread count.
func LayerNormBackward[T Float](dy, x, w, mean, rstd, dx, dw, db []T, rows, cols int) {
	layerNormBackward("LayerNormBackward", dy, x, halfRows{}, w, mean, rstd, dx, dw, db, rows, cols, false)
}

// LayerNormBackwardFresh is LayerNormBackward with dx written, not added
// to: dx's contents are unspecified, and the kernel stores 0 + each
// element's term where LayerNormBackward adds it, so the result is
// bitwise LayerNormBackward's into a zeroed dx (0 + -0 is +0, as there)
// without clearing dx first. dw and db still accumulate.
func LayerNormBackwardFresh[T Float](dy, x, w, mean, rstd, dx, dw, db []T, rows, cols int) {
	layerNormBackward("LayerNormBackwardFresh", dy, x, halfRows{}, w, mean, rstd, dx, dw, db, rows, cols, true)
}

// LayerNormBackwardFreshHalf is LayerNormBackwardFresh on x held as
// 2-byte bits, fp16 when f16 and bfloat16 otherwise (an activation stored
// in 2 bytes for the backward): each block of rows is widened exactly
// into a scratch buffer, in cache, just before the kernel reads it, so
// the result is bitwise that on the widened x without a float32 copy of
// all of it.
func LayerNormBackwardFreshHalf(f16 bool, dy []float32, x []uint16, w, mean, rstd, dx, dw, db []float32, rows, cols int) {
	layerNormBackward("LayerNormBackwardFreshHalf", dy, nil, halfRowsOf(f16, x), w, mean, rstd, dx, dw, db, rows, cols, true)
}

// halfRows is a norm's input held in 2 bytes and its widening.
type halfRows struct {
	h     []uint16
	widen func(dst []float32, src []uint16)
}

// halfRowsOf is x held as fp16 (f16) or bfloat16 bits.
func halfRowsOf(f16 bool, x []uint16) halfRows {
	return halfRows{x, func(dst []float32, src []uint16) { widenHalfs(f16, dst, src) }}
}

// layerNormBackward is the backward on x, or on xh when x is nil.
func layerNormBackward[T Float](op string, dy, x []T, xh halfRows, w, mean, rstd, dx, dw, db []T, rows, cols int, fresh bool) {
	nx := len(x)
	if x == nil {
		nx = len(xh.h)
	}
	checkRows(op, rows, cols, []int{len(dy), nx, len(dx)}, []int{len(mean), len(rstd)}, []int{len(w), len(dw), len(db)})
	if rows == 0 || cols == 0 {
		return
	}
	nblk := (rows + rowBlock - 1) / rowBlock
	part := getBuf[T](nblk * 2 * cols)
	defer putBuf(part)
	ParallelFor(nblk, 1, func(lo, hi int) {
		var wide *[]T // this chunk's widened rows of xh
		if x == nil {
			wide = getBuf[T](rowBlock * cols)
			defer putBuf(wide)
		}
		for blk := lo; blk < hi; blk++ {
			pw := (*part)[blk*2*cols : blk*2*cols+cols]
			pb := (*part)[blk*2*cols+cols : (blk+1)*2*cols]
			clear(pw)
			clear(pb)
			r0, r1 := blk*rowBlock, min(rows, (blk+1)*rowBlock)
			var xs []T
			if x != nil {
				xs = x[r0*cols : r1*cols]
			} else {
				xs = (*wide)[:(r1-r0)*cols]
				xh.widen(as32(xs), xh.h[r0*cols:r1*cols])
			}
			dys, dxs := dy[r0*cols:r1*cols], dx[r0*cols:r1*cols]
			switch {
			case isF32[T]() && fresh:
				layerNormBwd32Set(as32(dys), as32(xs), as32(w), as32(mean[r0:r1]), as32(rstd[r0:r1]), as32(dxs), as32(pw), as32(pb), cols)
			case isF32[T]():
				layerNormBwd32(as32(dys), as32(xs), as32(w), as32(mean[r0:r1]), as32(rstd[r0:r1]), as32(dxs), as32(pw), as32(pb), cols)
			default:
				layerNormBwdGo(dys, xs, w, mean[r0:r1], rstd[r0:r1], dxs, pw, pb, cols, fresh)
			}
		}
	})
	sumBlocks(*part, nblk, cols, dw, db)
}

// sumBlocks adds per-block partial sums into outs, blocks in order. Block
// i holds len(outs) runs of cols values, one per output. Parallel over
// columns, so the order of each column's additions is fixed.
func sumBlocks[T Float](part []T, nblk, cols int, outs ...[]T) {
	stride := len(outs) * cols
	ParallelFor(cols, 1024, func(lo, hi int) {
		for blk := 0; blk < nblk; blk++ {
			for o, out := range outs {
				p := part[blk*stride+o*cols : blk*stride+(o+1)*cols]
				for c := lo; c < hi; c++ {
					out[c] += p[c]
				}
			}
		}
	})
}

// The row loops of LayerNorm in Go. The cgo build runs C copies of them
// for float32 (fastpath.c) that perform the same operations in the same
// order, so both give bitwise the same results. Row sums use sumLanes
// partial sums (by position in the row, never by thread) both because a
// single running sum is a chain of dependent additions and so that the C
// copy can vectorise without changing the result.

// layerNormFwdGo normalises the len(mean) rows of x into y.
func layerNormFwdGo[T Float](x, w, b, y, mean, rstd []T, cols int, eps T) {
	w, b = w[:cols], b[:cols]
	for r := range mean {
		xr := x[r*cols : (r+1)*cols]
		yr := y[r*cols : (r+1)*cols]
		var acc [sumLanes]T
		full := cols - cols%sumLanes
		for i := 0; i < full; i += sumLanes {
			for j := range acc {
				acc[j] += xr[i+j]
			}
		}
		for i := full; i < cols; i++ {
			acc[i-full] += xr[i]
		}
		m := reduceLanes(&acc) / T(cols)
		acc = [sumLanes]T{}
		for i := 0; i < full; i += sumLanes {
			for j := range acc {
				d := xr[i+j] - m
				acc[j] += d * d
			}
		}
		for i := full; i < cols; i++ {
			d := xr[i] - m
			acc[i-full] += d * d
		}
		rs := T(1 / math.Sqrt(float64(reduceLanes(&acc)/T(cols)+eps)))
		for i, v := range xr {
			yr[i] = (v-m)*rs*w[i] + b[i]
		}
		mean[r], rstd[r] = m, rs
	}
}

// layerNormBwdGo accumulates dx for the len(mean) rows and adds the rows'
// contributions to dw and db into pw and pb; with set it writes dx as if
// it had been zeroed first, storing 0 + each term (one pass, bitwise the
// addition into a cleared dx).
func layerNormBwdGo[T Float](dy, x, w, mean, rstd, dx, pw, pb []T, cols int, set bool) {
	w, pw, pb = w[:cols], pw[:cols], pb[:cols]
	for r := range mean {
		dyr := dy[r*cols : (r+1)*cols]
		xr := x[r*cols : (r+1)*cols]
		dxr := dx[r*cols : (r+1)*cols]
		m, rs := mean[r], rstd[r]
		var ga, gxa [sumLanes]T
		full := cols - cols%sumLanes
		for i := 0; i < full; i += sumLanes {
			for j := range ga {
				g := dyr[i+j] * w[i+j]
				ga[j] += g
				gxa[j] += g * ((xr[i+j] - m) * rs)
			}
		}
		for i := full; i < cols; i++ {
			g := dyr[i] * w[i]
			ga[i-full] += g
			gxa[i-full] += g * ((xr[i] - m) * rs)
		}
		gMean, gxMean := reduceLanes(&ga)/T(cols), reduceLanes(&gxa)/T(cols)
		for i, v := range xr {
			xh := (v - m) * rs
			d := dyr[i]
			t := (d*w[i] - gMean - xh*gxMean) * rs
			if set {
				dxr[i] = 0 + t
			} else {
				dxr[i] += t
			}
			pw[i] += d * xh
			pb[i] += d
		}
	}
}

// reduceLanes sums the partial sums pairwise in a fixed tree.
func reduceLanes[T Float](acc *[sumLanes]T) T {
	for w := sumLanes / 2; w > 0; w /= 2 {
		for j := 0; j < w; j++ {
			acc[j] += acc[j+w]
		}
	}
	return acc[0]
}
