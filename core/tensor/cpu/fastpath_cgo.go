//go:build cgo && !purego

package cpu

/*
#cgo CFLAGS: -O3
#cgo LDFLAGS: -lm
#include "fastpath.h"
*/
import "C"

import "unsafe"

// In the cgo build the float32 fast paths run the C loops of fastpath.c,
// which the C compiler vectorises (with a variant per instruction set chosen
// at load time). Callers hand over whole chunks, so the cgo transition is
// paid once per thousands of elements.

func geluFwd32(x, y []float32) {
	if len(x) == 0 {
		return
	}
	_ = y[len(x)-1]
	C.tacc_gelu_fwd((*C.float)(&x[0]), (*C.float)(&y[0]), C.long(len(x)))
}

func geluBwd32(x, dy, dx []float32) {
	if len(x) == 0 {
		return
	}
	_, _ = dy[len(x)-1], dx[len(x)-1]
	C.tacc_gelu_bwd((*C.float)(&x[0]), (*C.float)(&dy[0]), (*C.float)(&dx[0]), C.long(len(x)))
}

func geluBwdBF16(x []uint16, dy, dx []float32) {
	if len(x) == 0 {
		return
	}
	_, _ = dy[len(x)-1], dx[len(x)-1]
	C.tacc_gelu_bwd_bf16((*C.uint16_t)(&x[0]), (*C.float)(&dy[0]), (*C.float)(&dx[0]), C.long(len(x)))
}

func geluBwd32Set(x, dy, dx []float32) {
	if len(x) == 0 {
		return
	}
	_, _ = dy[len(x)-1], dx[len(x)-1]
	C.tacc_gelu_bwd_set((*C.float)(&x[0]), (*C.float)(&dy[0]), (*C.float)(&dx[0]), C.long(len(x)))
}

func geluBwdBF16Set(x []uint16, dy, dx []float32) {
	if len(x) == 0 {
		return
	}
	_, _ = dy[len(x)-1], dx[len(x)-1]
	C.tacc_gelu_bwd_bf16_set((*C.uint16_t)(&x[0]), (*C.float)(&dy[0]), (*C.float)(&dx[0]), C.long(len(x)))
}

func softmaxPrefix32(att []float32, ld, width int, lens []int64, maxs, sums []float32) {
	rows := len(lens)
	if rows == 0 {
		return
	}
	_, _ = att[(rows-1)*ld+width-1], sums[rows-1]
	_ = maxs[rows-1]
	C.tacc_softmax_prefix((*C.float)(&att[0]), C.long(ld), C.long(width), C.long(rows),
		(*C.int64_t)(unsafe.Pointer(&lens[0])), (*C.float)(&maxs[0]), (*C.float)(&sums[0]))
}

func softmaxRows32(src, dst []float32, rows, n int, maxs, sums []float32) {
	if rows == 0 || n == 0 {
		return
	}
	_, _ = src[rows*n-1], dst[rows*n-1]
	var pm, ps *C.float
	if maxs != nil {
		_, _ = maxs[rows-1], sums[rows-1]
		pm, ps = (*C.float)(&maxs[0]), (*C.float)(&sums[0])
	}
	C.tacc_softmax_rows((*C.float)(&src[0]), (*C.float)(&dst[0]), C.long(rows), C.long(n), pm, ps)
}

func layerNormFwd32(x, w, b, y, mean, rstd []float32, cols int, eps float32) {
	rows := len(mean)
	if rows == 0 || cols == 0 {
		return
	}
	_, _, _, _, _ = x[rows*cols-1], y[rows*cols-1], w[cols-1], b[cols-1], rstd[rows-1]
	C.tacc_layernorm_fwd((*C.float)(&x[0]), (*C.float)(&w[0]), (*C.float)(&b[0]), (*C.float)(&y[0]),
		(*C.float)(&mean[0]), (*C.float)(&rstd[0]), C.long(rows), C.long(cols), C.float(eps))
}

func layerNormBwd32(dy, x, w, mean, rstd, dx, pw, pb []float32, cols int) {
	rows := len(mean)
	if rows == 0 || cols == 0 {
		return
	}
	_, _, _, _ = dy[rows*cols-1], x[rows*cols-1], dx[rows*cols-1], rstd[rows-1]
	_, _, _ = w[cols-1], pw[cols-1], pb[cols-1]
	C.tacc_layernorm_bwd((*C.float)(&dy[0]), (*C.float)(&x[0]), (*C.float)(&w[0]), (*C.float)(&mean[0]),
		(*C.float)(&rstd[0]), (*C.float)(&dx[0]), (*C.float)(&pw[0]), (*C.float)(&pb[0]), C.long(rows), C.long(cols))
}

func layerNormBwd32Set(dy, x, w, mean, rstd, dx, pw, pb []float32, cols int) {
	rows := len(mean)
	if rows == 0 || cols == 0 {
		return
	}
	_, _, _, _ = dy[rows*cols-1], x[rows*cols-1], dx[rows*cols-1], rstd[rows-1]
	_, _, _ = w[cols-1], pw[cols-1], pb[cols-1]
	C.tacc_layernorm_bwd_set((*C.float)(&dy[0]), (*C.float)(&x[0]), (*C.float)(&w[0]), (*C.float)(&mean[0]),
		(*C.float)(&rstd[0]), (*C.float)(&dx[0]), (*C.float)(&pw[0]), (*C.float)(&pb[0]), C.long(rows), C.long(cols))
}

func colSums32(dy, p []float32, cols int) {
	rows := len(dy) / max(cols, 1)
	if rows == 0 || cols == 0 {
		return
	}
	_ = p[cols-1]
	C.tacc_col_sums((*C.float)(&dy[0]), (*C.float)(&p[0]), C.long(rows), C.long(cols))
}

func addBias32(y, b []float32, cols int) {
	rows := len(y) / max(cols, 1)
	if rows == 0 || cols == 0 {
		return
	}
	_ = b[cols-1]
	C.tacc_add_bias((*C.float)(&y[0]), (*C.float)(&b[0]), C.long(rows), C.long(cols))
}

func add32(x, y, z []float32) {
	if len(z) == 0 {
		return
	}
	_, _ = x[len(z)-1], y[len(z)-1]
	C.tacc_add((*C.float)(&x[0]), (*C.float)(&y[0]), (*C.float)(&z[0]), C.long(len(z)))
}

func axpy32(a float32, x, y []float32) {
	if len(x) == 0 {
		return
	}
	_ = y[len(x)-1]
	C.tacc_axpy(C.float(a), (*C.float)(&x[0]), (*C.float)(&y[0]), C.long(len(x)))
}

// The bf16 conversions hand over at least this many elements to C; shorter
// slices stay in Go, where the cgo transition would cost more than the loop.
const convC = 256

func bf16FromF32s(dst []uint16, src []float32) {
	if len(src) < convC {
		bf16FromF32sGo(dst, src)
		return
	}
	_ = dst[len(src)-1]
	C.tacc_bf16_from_f32((*C.uint32_t)(unsafe.Pointer(&src[0])), (*C.uint16_t)(&dst[0]), C.long(len(src)))
}

func bf16FromF32sStream(dst []uint16, src []float32) {
	if len(src) < convC {
		bf16FromF32sGo(dst, src)
		return
	}
	_ = dst[len(src)-1]
	C.tacc_bf16_from_f32_stream((*C.uint32_t)(unsafe.Pointer(&src[0])), (*C.uint16_t)(&dst[0]), C.long(len(src)))
}

func bf16ToF32s(dst []float32, src []uint16) {
	if len(src) < convC {
		bf16ToF32sGo(dst, src)
		return
	}
	_ = dst[len(src)-1]
	C.tacc_bf16_to_f32((*C.uint16_t)(&src[0]), (*C.uint32_t)(unsafe.Pointer(&dst[0])), C.long(len(src)))
}

func roundBF16(x []float32) {
	if len(x) < convC {
		roundBF16Go(x)
		return
	}
	C.tacc_round_bf16((*C.uint32_t)(unsafe.Pointer(&x[0])), C.long(len(x)))
}

func expMinus32(row []float32, lse float32) {
	if len(row) == 0 {
		return
	}
	C.tacc_exp_minus((*C.float)(&row[0]), C.long(len(row)), C.float(lse))
}

func lseBackward32(p, dp []float32, delta float32) {
	if len(p) == 0 {
		return
	}
	dp = dp[:len(p)]
	C.tacc_lse_backward((*C.float)(&p[0]), (*C.float)(&dp[0]), C.long(len(p)), C.float(delta))
}

func lseRows32(lse, maxs, sums []float32) {
	if len(lse) == 0 {
		return
	}
	_, _ = maxs[len(lse)-1], sums[len(lse)-1]
	C.tacc_lse_rows((*C.float)(&lse[0]), (*C.float)(&maxs[0]), (*C.float)(&sums[0]), C.long(len(lse)))
}

// rowsNeed panics unless x holds rows rows of stride ld out to ends[r]
// entries each, as the row loops below read them.
func rowsNeed(x []float32, ld int, ends []int64) {
	for r, e := range ends {
		_ = x[:r*ld+int(e)]
	}
}

func expMinusRows32(p []float32, ld int, lens, ends []int64, lse []float32) {
	if len(lens) == 0 {
		return
	}
	rowsNeed(p, ld, ends)
	_, _ = ends[len(lens)-1], lse[len(lens)-1]
	C.tacc_exp_minus_rows((*C.float)(&p[0]), C.long(ld), C.long(len(lens)), (*C.int64_t)(&lens[0]), (*C.int64_t)(&ends[0]),
		(*C.float)(&lse[0]))
}

func lseBackwardRows32(p, dp []float32, ld int, lens, ends []int64, delta []float32) {
	if len(lens) == 0 {
		return
	}
	rowsNeed(p, ld, lens)
	rowsNeed(dp, ld, ends)
	_, _ = ends[len(lens)-1], delta[len(lens)-1]
	C.tacc_lse_backward_rows((*C.float)(&p[0]), (*C.float)(&dp[0]), C.long(ld), C.long(len(lens)), (*C.int64_t)(&lens[0]),
		(*C.int64_t)(&ends[0]), (*C.float)(&delta[0]))
}

// attnDelta32 runs rows [lo, hi) of AttentionDelta on float32; the
// caller has checked the sizes.
func attnDelta32(d AttnDims, dout, out, delta []float32, lo, hi int) {
	if lo >= hi {
		return
	}
	C.tacc_attn_delta((*C.float)(&dout[0]), (*C.float)(&out[0]), (*C.float)(&delta[0]), C.long(lo), C.long(hi),
		C.long(d.Tq), C.long(d.NH), C.long(d.HS), C.long(d.LdO))
}

func adamW32(p, g, m, v []float32, gscale, decay, b1, b2, ob1, ob2, step, bc2Sqrt, eps float32) {
	if len(p) == 0 {
		return
	}
	_, _, _ = g[len(p)-1], m[len(p)-1], v[len(p)-1]
	C.tacc_adamw((*C.float)(&p[0]), (*C.float)(&g[0]), (*C.float)(&m[0]), (*C.float)(&v[0]), C.long(len(p)),
		C.float(gscale), C.float(decay), C.float(b1), C.float(b2), C.float(ob1), C.float(ob2), C.float(step), C.float(bc2Sqrt), C.float(eps))
}

func siluMulFwd32(x, y []float32, rows, n int) {
	if rows == 0 || n == 0 {
		return
	}
	_, _ = x[2*rows*n-1], y[rows*n-1]
	C.tacc_silu_mul_fwd((*C.float)(&x[0]), (*C.float)(&y[0]), C.long(rows), C.long(n))
}

func siluMulBwd32(x, dy, dx []float32, rows, n int) {
	if rows == 0 || n == 0 {
		return
	}
	_, _, _ = x[2*rows*n-1], dy[rows*n-1], dx[2*rows*n-1]
	C.tacc_silu_mul_bwd((*C.float)(&x[0]), (*C.float)(&dy[0]), (*C.float)(&dx[0]), C.long(rows), C.long(n))
}

func rmsNormFwd32(x, w, y, rstd []float32, cols int, eps float32) {
	rows := len(rstd)
	if rows == 0 || cols == 0 {
		return
	}
	_, _, _ = x[rows*cols-1], y[rows*cols-1], w[cols-1]
	C.tacc_rmsnorm_fwd((*C.float)(&x[0]), (*C.float)(&w[0]), (*C.float)(&y[0]), (*C.float)(&rstd[0]), C.long(rows), C.long(cols), C.float(eps))
}

func rmsNormBwd32(dy, x, w, rstd, dx, pw []float32, cols int) {
	rows := len(rstd)
	if rows == 0 || cols == 0 {
		return
	}
	_, _, _, _, _ = dy[rows*cols-1], x[rows*cols-1], dx[rows*cols-1], w[cols-1], pw[cols-1]
	C.tacc_rmsnorm_bwd((*C.float)(&dy[0]), (*C.float)(&x[0]), (*C.float)(&w[0]), (*C.float)(&rstd[0]),
		(*C.float)(&dx[0]), (*C.float)(&pw[0]), C.long(rows), C.long(cols))
}

func ropeRotate32(x, y []float32, lo, hi, T, ld, col, n, h int, cos, sin []float64, sign float64) {
	if hi <= lo || n == 0 {
		return
	}
	_, _ = x[(hi-1)*ld+col+n-1], y[(hi-1)*ld+col+n-1]
	_, _ = cos[T*h-1], sin[T*h-1]
	C.tacc_rope_rotate((*C.float)(&x[0]), (*C.float)(&y[0]), C.long(lo), C.long(hi), C.long(T), C.long(ld), C.long(col),
		C.long(n), C.long(h), (*C.double)(&cos[0]), (*C.double)(&sin[0]), C.double(sign))
}
