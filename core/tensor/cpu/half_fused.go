package cpu

// The forward kernels whose inputs and outputs the backward keeps in 2
// bytes under mixed precision also write those 2-byte copies as they
// go: each piece of the output is computed and, while it and the piece
// of the input are in cache, both are rounded into their copies
// (nil: not wanted). So the copies cost no pass of their own over
// memory, as rounding the float32 tensors once the block's forward is
// done (tensor.StoreHalf) would. Each is bitwise the kernel followed by
// the rounding (the naive form beside it, which the tests hold it to).

// halfPiece is the number of elements a fused kernel computes before it
// rounds them: input, output and copies stay in the first-level cache.
const halfPiece = 4096

// narrowHalf rounds src into dst, fp16 when f16 and bfloat16 otherwise,
// to nearest even; nothing when dst is nil. The bfloat16 copy, which
// nothing reads before the backward, is written past the caches
// (bf16FromF32sStream), so its lines are not read in from memory first.
func narrowHalf(f16 bool, dst []uint16, src []float32) {
	switch {
	case dst == nil:
	case f16:
		F16FromF32s(dst, src)
	default:
		bf16FromF32sStream(dst, src)
	}
}

// GeluForwardHalf is GeluForward on float32 that also rounds x into hx
// and y into hy (each nil or as long as x), fp16 when f16 and bfloat16
// otherwise: bitwise geluForwardHalfNaive. y must not alias x when hx is
// wanted.
func GeluForwardHalf(f16 bool, x, y []float32, hx, hy []uint16) {
	checkLen("GeluForwardHalf", len(x), len(y))
	for _, h := range [][]uint16{hx, hy} {
		if h != nil {
			checkLen("GeluForwardHalf", len(x), len(h))
		}
	}
	ParallelFor(len(x), elemGrain, func(lo, hi int) {
		for p := lo; p < hi; p += halfPiece {
			q := min(hi, p+halfPiece)
			geluFwd32(x[p:q], y[p:q])
			narrowHalf(f16, sub(hx, p, q), x[p:q])
			narrowHalf(f16, sub(hy, p, q), y[p:q])
		}
	})
}

// geluForwardHalfNaive is GeluForwardHalf as three passes.
func geluForwardHalfNaive(f16 bool, x, y []float32, hx, hy []uint16) {
	narrowHalf(f16, hx, x)
	GeluForward(x, y)
	narrowHalf(f16, hy, y)
}

// LayerNormForwardHalf is LayerNormForward on float32 that also rounds
// x into hx and y into hy (each nil or rows*cols long), fp16 when f16
// and bfloat16 otherwise: bitwise layerNormForwardHalfNaive.
func LayerNormForwardHalf(f16 bool, x, w, b, y, mean, rstd []float32, rows, cols int, eps float32, hx, hy []uint16) {
	checkRows("LayerNormForwardHalf", rows, cols, []int{len(x), len(y)}, []int{len(mean), len(rstd)}, []int{len(w), len(b)})
	byPieces("LayerNormForwardHalf", f16, rows, cols, max(1, elemGrain/(4*cols)), x, y, hx, hy, func(r, s int) {
		layerNormFwd32(x[r*cols:s*cols], w, b, y[r*cols:s*cols], mean[r:s], rstd[r:s], cols, eps)
	})
}

// byPieces runs a norm's forward (kernel, on rows [r, s)) over the threads
// in chunks of at least grain rows, a piece of about halfPiece numbers at
// a time, and narrows each piece's rows of x into hx and of y into hy
// (nil: not wanted) right after, while they are in cache.
func byPieces(op string, f16 bool, rows, cols, grain int, x, y []float32, hx, hy []uint16, kernel func(r, s int)) {
	for _, h := range [][]uint16{hx, hy} {
		if h != nil {
			checkRows(op, rows, cols, []int{len(h)}, nil, nil)
		}
	}
	if rows == 0 || cols == 0 {
		return
	}
	step := max(1, halfPiece/cols) // rows a piece
	ParallelFor(rows, grain, func(lo, hi int) {
		for r := lo; r < hi; r += step {
			s := min(hi, r+step)
			p, q := r*cols, s*cols
			kernel(r, s)
			narrowHalf(f16, sub(hx, p, q), x[p:q])
			narrowHalf(f16, sub(hy, p, q), y[p:q])
		}
	})
}

// layerNormForwardHalfNaive is LayerNormForwardHalf as three passes.
func layerNormForwardHalfNaive(f16 bool, x, w, b, y, mean, rstd []float32, rows, cols int, eps float32, hx, hy []uint16) {
	narrowHalf(f16, hx, x[:rows*cols])
	LayerNormForward(x, w, b, y, mean, rstd, rows, cols, eps)
	narrowHalf(f16, hy, y[:rows*cols])
}

// RMSNormForwardHalf is RMSNormForward on float32 that also rounds x into
// hx and y into hy (each nil or rows*cols long), fp16 when f16 and
// bfloat16 otherwise, a piece of rows at a time while it is in cache:
// bitwise rmsNormForwardHalfNaive.
func RMSNormForwardHalf(f16 bool, x, w, y, rstd []float32, rows, cols int, eps float64, hx, hy []uint16) {
	checkRows("RMSNormForwardHalf", rows, cols, []int{len(x), len(y)}, []int{len(rstd)}, []int{len(w)})
	byPieces("RMSNormForwardHalf", f16, rows, cols, max(1, elemGrain/(2*cols)), x, y, hx, hy, func(r, s int) {
		rmsNormFwd32(x[r*cols:s*cols], w, y[r*cols:s*cols], rstd[r:s], cols, float32(eps))
	})
}

// rmsNormForwardHalfNaive is RMSNormForwardHalf as three passes.
func rmsNormForwardHalfNaive(f16 bool, x, w, y, rstd []float32, rows, cols int, eps float64, hx, hy []uint16) {
	narrowHalf(f16, hx, x[:rows*cols])
	RMSNormForward(x, w, y, rstd, rows, cols, eps)
	narrowHalf(f16, hy, y[:rows*cols])
}

// RoundHalfInto rounds x in place to fp16 when f16 and bfloat16
// otherwise (RoundF16, RoundBF16) and writes the rounded values' 2-byte
// bits into h (as long as x), a piece at a time: bitwise the rounding
// followed by the narrowing of the result, in one pass over memory.
func RoundHalfInto(f16 bool, x []float32, h []uint16) {
	checkLen("RoundHalfInto", len(x), len(h))
	ParallelFor(len(x), 1<<16, func(lo, hi int) {
		for p := lo; p < hi; p += halfPiece {
			q := min(hi, p+halfPiece)
			if f16 {
				RoundF16(x[p:q])
			} else {
				RoundBF16(x[p:q])
			}
			narrowHalf(f16, h[p:q], x[p:q])
		}
	})
}

// sub is h[p:q], or nil for a copy not wanted.
func sub(h []uint16, p, q int) []uint16 {
	if h == nil {
		return nil
	}
	return h[p:q]
}
