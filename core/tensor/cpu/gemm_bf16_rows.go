package cpu

import "fmt"

// halfSpan is the right operand X[r0:r0+k] of the attention's
// half-precision products C = alpha op(A) X[r0:r0+k] + beta C, for X the
// rows of a head's values, keys, queries or output gradients: P·v and
// dS·k read growing prefixes of the key rows, dS^T·q and P^T·dout
// shrinking suffixes of the query rows, one product a row block. On the
// bf16 kernel X is packed once (packBF16Rows) and each product reads its
// run of rows from that packing rather than packing it again: bitwise
// gemmHalfSerial's on those rows. Elsewhere (fp16, the portable path) and
// for a run that starts or ends inside a pair of the packing, each product
// is gemmHalfSerial's.
type halfSpan struct {
	f16            bool
	x              []float32
	ld, rows, cols int
	packed         *[]uint16 // the bf16 kernel's packing of X, or nil
}

// newHalfSpan takes the rows x cols matrix x of stride ld, packing it for
// the bf16 kernel where products take it.
func newHalfSpan(f16 bool, x []float32, ld, rows, cols int) *halfSpan {
	h := &halfSpan{f16: f16, x: x, ld: ld, rows: rows, cols: cols}
	if rows == 0 || cols == 0 || f16 || !bf16Kernel.Load() {
		return h
	}
	checkGemm(false, false, rows, cols, 0, len(x), ld, 0, 1, rows*cols, cols)
	h.packed = packBF16Rows(rows, cols, x, ld)
	return h
}

// mul is gemmHalfSerial(f16, transA, false, m, cols, k, alpha, a, lda,
// X[r0:], ld, beta, c, ldc) on the calling goroutine.
func (h *halfSpan) mul(transA bool, m, r0, k int, alpha float32, a []float32, lda int, beta float32, c []float32, ldc int) {
	if r0 < 0 || k < 0 || r0+k > h.rows {
		panic(fmt.Sprintf("cpu: half product over rows [%d, %d) of %d", r0, r0+k, h.rows))
	}
	packed := h.packed != nil && r0%2 == 0 && ((r0+k)%2 == 0 || r0+k == h.rows)
	if !packed || m == 0 || k == 0 {
		var x []float32
		if k > 0 {
			x = h.x[r0*h.ld:]
		}
		gemmHalfSerial(h.f16, transA, false, m, h.cols, k, alpha, a, lda, x, h.ld, beta, c, ldc)
		return
	}
	checkGemm(transA, false, m, h.cols, k, len(a), lda, k*h.cols, h.cols, len(c), ldc)
	// as gemmHalfSerial: beta == 0, the kernel stores the products without reading C
	if beta != 0 {
		scaleC(m, h.cols, beta, c, ldc)
	}
	gemmBF16Rows(*h.packed, h.rows, h.cols, r0, k, m, transA, alpha, a, lda, beta == 0, c, ldc)
}

// release gives the packing back.
func (h *halfSpan) release() {
	if h.packed != nil {
		releaseBF16Keys(h.packed)
	}
	h.packed = nil
}

// spanProduct returns mul(ta, m, r0, k, alpha, a, lda, beta, c, ldc),
// which sets C to alpha op(A) X[r0:r0+k] + beta C for X the rows rows of x
// (stride ld, HS columns), as gemm(ta, false, m, d.HS, k, alpha, a, lda,
// x[r0*ld:], ld, beta, c, ldc) does: the products of one head whose row
// blocks read runs of the same rows (P·v and dS·k over the keys, dS^T·q
// and P^T·dout over the queries). Under HalfProducts (float32) X is
// packed once for all of them (halfSpan), with the same result. release
// gives back what it holds.
func spanProduct[F Float](d AttnDims, gemm gemmFunc[F], x []F, ld, rows int) (mul func(ta bool, m, r0, k int, alpha F, a []F, lda int, beta F, c []F, ldc int), release func()) {
	if d.HalfProducts == NoHalf || !isF32[F]() {
		return func(ta bool, m, r0, k int, alpha F, a []F, lda int, beta F, c []F, ldc int) {
			gemm(ta, false, m, d.HS, k, alpha, a, lda, x[r0*ld:], ld, beta, c, ldc)
		}, func() {}
	}
	h := newHalfSpan(d.HalfProducts == F16, as32(x), ld, rows, d.HS)
	return func(ta bool, m, r0, k int, alpha F, a []F, lda int, beta F, c []F, ldc int) {
		h.mul(ta, m, r0, k, float32(alpha), as32(a), lda, float32(beta), as32(c), ldc)
	}, h.release
}
