package cpu

import (
	"fmt"
)

// Half-precision matrix products: the operands hold bfloat16 or fp16
// numbers, the products accumulate in float32 and C is float32, the
// recipe of mixed-precision training (tensor cores and CPUs' bf16
// instructions do the same).
//
// Which path a CPU gets (HalfGemmPath says):
//   - bf16 on a CPU with AVX512-BF16 in the cgo build: the kernel of
//     gemm_bf16.c on VDPBF16PS, which multiplies bf16 pairs and adds them
//     to float32 lanes at twice the float32 FMA rate;
//   - bf16 elsewhere (and with TINYACC_BF16_KERNEL=off), and fp16
//     everywhere: the operands are widened to float32 (exactly: every
//     half is a float32) and the float32 Gemm runs, so the products are
//     exact and the sums are float32 sums. fp16 has no fast path here:
//     x86 CPUs without AVX512-FP16 have only conversions for it (F16C's,
//     which half_f16c.c uses).

// halfOperand is one operand of a half-precision product: stored as 16-bit
// patterns (h), or as float32 (f) that the product rounds to the half
// format first, so callers with float32 activations need no converted copy.
type halfOperand struct {
	h     []uint16
	f     []float32
	f16   bool // the format is fp16 rather than bf16
	exact bool // f already holds half values (RoundHalfOnce): read as it is
}

// from returns the operand from element off of its storage on.
func (o halfOperand) from(off int) halfOperand {
	if o.f != nil {
		o.f = o.f[off:]
	} else {
		o.h = o.h[off:]
	}
	return o
}

func (o halfOperand) len() int {
	if o.f != nil {
		return len(o.f)
	}
	return len(o.h)
}

// GemmBF16 computes C = alpha*op(A)*op(B) + beta*C, with A and B holding
// bfloat16 numbers and C float32; the arguments are Gemm's.
func GemmBF16(transA, transB bool, m, n, k int, alpha float32, a []uint16, lda int, b []uint16, ldb int, beta float32, c []float32, ldc int) {
	gemmHalf(transA, transB, m, n, k, alpha, halfOperand{h: a}, lda, halfOperand{h: b}, ldb, beta, c, ldc)
}

// GemmRoundBF16 is GemmBF16 on float32 operands rounded to bfloat16 (to
// nearest even) as they are read: the same result, bitwise, as GemmBF16 on
// BF16FromF32s of A and B, without the converted copies.
func GemmRoundBF16(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	gemmHalf(transA, transB, m, n, k, alpha, halfOperand{f: a}, lda, halfOperand{f: b}, ldb, beta, c, ldc)
}

// GemmRoundF16 is GemmF16 on float32 operands rounded to fp16 as they are
// read (values past 65504 become infinities, as in an fp16 copy).
func GemmRoundF16(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	gemmHalf(transA, transB, m, n, k, alpha, halfOperand{f: a, f16: true}, lda, halfOperand{f: b, f16: true}, ldb, beta, c, ldc)
}

// GemmRoundAHalfB is GemmRoundBF16 (GemmRoundF16 when f16) with B already
// stored in the half format: a parameter's half-precision copy, read as
// stored, times a float32 activation rounded as it is read. The result is
// bitwise that of GemmRoundBF16 on the float32 B the copy was rounded from.
func GemmRoundAHalfB(f16, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []uint16, ldb int, beta float32, c []float32, ldc int) {
	gemmHalf(transA, transB, m, n, k, alpha, halfOperand{f: a, f16: f16}, lda, halfOperand{h: b, f16: f16}, ldb, beta, c, ldc)
}

// GemmHalfARoundB is GemmRoundAHalfB with the roles swapped: A already
// stored in the half format (an activation kept in 2 bytes for the
// backward), B float32 rounded as it is read. The result is bitwise that
// of GemmRoundBF16 (GemmRoundF16 when f16) on the float32 A the stored one
// was rounded from.
func GemmHalfARoundB(f16, transA, transB bool, m, n, k int, alpha float32, a []uint16, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	gemmHalf(transA, transB, m, n, k, alpha, halfOperand{h: a, f16: f16}, lda, halfOperand{f: b, f16: f16}, ldb, beta, c, ldc)
}

// GemmF16 computes C = alpha*op(A)*op(B) + beta*C, with A and B holding
// IEEE fp16 numbers and C float32.
func GemmF16(transA, transB bool, m, n, k int, alpha float32, a []uint16, lda int, b []uint16, ldb int, beta float32, c []float32, ldc int) {
	gemmHalf(transA, transB, m, n, k, alpha, halfOperand{h: a, f16: true}, lda, halfOperand{h: b, f16: true}, ldb, beta, c, ldc)
}

// HalfGemmPath names the path GemmBF16 takes now on this CPU and build:
// "avx512bf16", or "float32 <BLASName>", the portable path, which fp16
// products always take (with the reason where the CPU has the kernel).
func HalfGemmPath() string {
	if bf16Kernel.Load() {
		return "avx512bf16"
	}
	if bf16Native {
		return "float32 " + BLASName() + " (avx512bf16 turned off)"
	}
	return "float32 " + BLASName()
}

func gemmHalf(transA, transB bool, m, n, k int, alpha float32, a halfOperand, lda int, b halfOperand, ldb int, beta float32, c []float32, ldc int) {
	checkGemm(transA, transB, m, n, k, a.len(), lda, b.len(), ldb, len(c), ldc)
	if bf16Kernel.Load() && !a.f16 && !b.f16 && m > 0 && n > 0 && k > 0 {
		// beta == 0: the kernel stores the products without reading C
		if beta != 0 {
			scaleC(m, n, beta, c, ldc)
		}
		gemmBF16Native(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta == 0, c, ldc)
		return
	}
	gemmHalfWiden(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// gemmHalfWiden is the portable path: widen both operands to float32 and
// run the float32 product. A product of at least 2*widenRows rows splits
// C's rows into widenParts blocks, one per kernel thread: each goroutine
// widens its block's rows of A and runs a single-threaded BLAS call on
// them (serialBLAS), as the attention's heads do. A threaded BLAS call
// instead hands its work to the library's own threads, which spin in
// sched_yield between calls while the goroutines round the next
// product's operands on the same cores, and wait for each other at every
// call's end; on 2 cores shared with other work, the portable step spent
// about as much CPU spinning as rounding. The blocks depend only on m and
// Threads(), so, as for a threaded Gemm, a product's bits depend on the
// thread count and on nothing else. Smaller products take one threaded
// Gemm.
func gemmHalfWiden(transA, transB bool, m, n, k int, alpha float32, a halfOperand, lda int, b halfOperand, ldb int, beta float32, c []float32, ldc int) {
	wb, bb := b.widen(transB, k, n, ldb, true)
	defer putWidenBuf(bb)
	parts := widenParts(m)
	if parts == 1 || n == 0 || k == 0 {
		wa, ba := a.widen(transA, m, k, lda, true)
		Gemm(transA, transB, m, n, k, alpha, wa, lda, wb, ldb, beta, c, ldc)
		putWidenBuf(ba)
		return
	}
	defer serialBLAS()()
	ParallelFor(parts, 1, func(plo, phi int) {
		for p := plo; p < phi; p++ {
			lo, hi := p*m/parts, (p+1)*m/parts
			off := lo * lda // op(A)'s rows lo..hi: rows of A, or its columns
			if transA {
				off = lo
			}
			ar := a.from(off)
			wa, ba := ar.widen(transA, hi-lo, k, lda, false)
			gemmBLAS(transA, transB, hi-lo, n, k, alpha, wa, lda, wb, ldb, beta, c[lo*ldc:], ldc)
			putWidenBuf(ba)
		}
	})
}

// widenRows is the fewest rows of C a block of gemmHalfWiden holds.
const widenRows = 64

// widenParts is the number of row blocks gemmHalfWiden splits m rows of C
// into: Threads(), or fewer so that each holds widenRows rows; block p
// holds rows [p*m/parts, (p+1)*m/parts).
func widenParts(m int) int {
	return max(1, min(Threads(), m/widenRows))
}

// widen returns op(o), an operand of rows x cols (stored transposed when
// trans) at row stride ld, as float32 numbers at the same stride, and the
// pooled buffer holding them (putWidenBuf gives it back), over the
// kernels' threads when par. A float32 operand that already holds half
// values (a stored activation widened back, q|k|v) is returned as it is,
// with no buffer: rounding would change none of its bits. Any other is
// rounded, or its 2-byte numbers widened, into the buffer, in one pass
// over the elements the product reads: callers' slices may run on past
// them (a head's queries, to the end of the batch's) and hold other
// columns between the rows (the other heads'), which stay unread.
func (o halfOperand) widen(trans bool, rows, cols, ld int, par bool) ([]float32, *[]float32) {
	if trans {
		rows, cols = cols, rows
	}
	if rows == 0 || cols == 0 {
		return nil, nil // the product reads nothing of it
	}
	if o.f != nil && (o.exact || exactHalf(o.f16, o.f, rows, cols, ld)) {
		return o.f, nil
	}
	buf := getWidenBuf((rows-1)*ld + cols)
	out := *buf
	conv := func(lo, hi int) { // rows [lo, hi)
		switch {
		case o.f != nil:
			roundHalf(o.f16, out[lo*ld:], o.f[lo*ld:], hi-lo, cols, ld, ld)
		case ld == cols:
			widenHalfs(o.f16, out[lo*ld:hi*ld], o.h[lo*ld:hi*ld])
		default:
			for r := lo; r < hi; r++ {
				widenHalfs(o.f16, out[r*ld:r*ld+cols], o.h[r*ld:r*ld+cols])
			}
		}
	}
	if par {
		ParallelFor(rows, max(1, (1<<16)/cols), conv)
	} else {
		conv(0, rows)
	}
	return out, buf
}

// widenHalfs is F16ToF32s (f16) or BF16ToF32s.
func widenHalfs(f16 bool, dst []float32, src []uint16) {
	if f16 {
		F16ToF32s(dst, src)
	} else {
		BF16ToF32s(dst, src)
	}
}

// gemmHalfSerial is GemmRoundBF16 (GemmRoundF16 when f16) on the calling
// goroutine only, for the attention's per-head products, which run inside
// a head-parallel loop that holds the BLAS library single-threaded
// (serialBLAS). Each operand is a head's columns of a larger buffer (a
// fused q|k|v, the probabilities of a row block), so the portable path
// rounds only the region the product reads, into a dense scratch copy,
// unless it already holds half values (halfOperand.serial), and calls
// gemmBLAS on what it reads.
func gemmHalfSerial(f16, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	checkGemm(transA, transB, m, n, k, len(a), lda, len(b), ldb, len(c), ldc)
	if m == 0 || n == 0 {
		return
	}
	if k == 0 {
		scaleC(m, n, beta, c, ldc)
		return
	}
	ao, bo := halfOperand{f: a, f16: f16}, halfOperand{f: b, f16: f16}
	if bf16Kernel.Load() && !f16 {
		// beta == 0: the kernel stores the products without reading C
		if beta != 0 {
			scaleC(m, n, beta, c, ldc)
		}
		gemmBF16Serial(transA, transB, m, n, k, alpha, ao, lda, bo, ldb, beta == 0, c, ldc)
		return
	}
	ar, ac := m, k // op(A) is m x k, stored ar x ac
	if transA {
		ar, ac = k, m
	}
	br, bc := k, n
	if transB {
		br, bc = n, k
	}
	aw, sa, ra := ao.serial(ar, ac, lda)
	defer ra()
	bw, sb, rb := bo.serial(br, bc, ldb)
	defer rb()
	gemmBLAS(transA, transB, m, n, k, alpha, aw, sa, bw, sb, beta, c, ldc)
}

// serial returns what the portable path's serial products read for the
// float32 operand's rows x cols matrix at stride ld, with its stride and
// the function that gives its storage back: the operand itself where it
// already holds half values (q|k|v, rounded where they are made, and
// widened back in the backward; exactHalf stops at the first number that
// is not, one of the first of a probability or a gradient), else a dense
// rounded copy in a pooled buffer. Either way the product reads the same
// numbers, so its result is the same, bitwise.
func (o halfOperand) serial(rows, cols, ld int) ([]float32, int, func()) {
	if exactHalf(o.f16, o.f, rows, cols, ld) {
		return o.f, ld, func() {}
	}
	w := getBuf[float32](rows * cols)
	o.roundInto(*w, rows, cols, ld)
	return *w, cols, func() { putBuf(w) }
}

// halfKeys is the right operand X^T of the half-precision products C =
// alpha A X[:n]^T, for X the rows of a head's keys (or values): the
// attention's row blocks read growing prefixes of the same rows, so X is
// rounded once, packed for the bf16 kernel (packBF16Keys) or for the
// portable path as a dense rounded copy (X itself where it holds half
// values already), rather than once per product.
// Results are bitwise gemmHalfSerial's on X's first n rows.
type halfKeys struct {
	f16        bool
	rows, cols int
	packed     *[]uint16 // the bf16 kernel's packing of X^T
	x          []float32 // the portable path's rounded X (halfOperand.serial), stride ld
	ld         int
	free       func() // gives x's storage back
}

// newHalfKeys rounds (or packs) the rows x cols matrix x of stride ld.
func newHalfKeys(f16 bool, x []float32, ld, rows, cols int) *halfKeys {
	h := &halfKeys{f16: f16, rows: rows, cols: cols}
	if rows == 0 || cols == 0 {
		return h
	}
	checkGemm(false, false, rows, cols, 0, len(x), ld, 0, 1, rows*cols, cols)
	if bf16Kernel.Load() && !f16 {
		h.packed = packBF16Keys(cols, rows, x, ld)
		return h
	}
	h.x, h.ld, h.free = halfOperand{f: x, f16: f16}.serial(rows, cols, ld)
	return h
}

// mul sets C (m x n, stride ldc) to alpha*A*X[:n]^T, A (m x cols, stride
// lda) rounded as read, on the calling goroutine.
func (h *halfKeys) mul(m, n int, alpha float32, a []float32, lda int, c []float32, ldc int) {
	if n > h.rows {
		panic(fmt.Sprintf("cpu: half product over %d rows of %d", n, h.rows))
	}
	checkGemm(false, true, m, n, h.cols, len(a), lda, n*h.cols, h.cols, len(c), ldc)
	switch {
	case m == 0 || n == 0:
	case h.cols == 0:
		scaleC(m, n, 0, c, ldc)
	case h.packed != nil:
		gemmBF16Keys(*h.packed, m, n, h.cols, alpha, a, lda, c, ldc)
	default:
		aw, sa, release := halfOperand{f: a, f16: h.f16}.serial(m, h.cols, lda)
		defer release()
		gemmBLAS(false, true, m, n, h.cols, alpha, aw, sa, h.x, h.ld, 0, c, ldc)
	}
}

// release gives the rounded rows back.
func (h *halfKeys) release() {
	if h.packed != nil {
		releaseBF16Keys(h.packed)
	}
	if h.free != nil {
		h.free()
	}
	h.packed, h.x, h.free = nil, nil, nil
}

// roundInto sets dst (rows x cols, dense) to the float32 operand's rows x
// cols matrix of stride ld, rounded to the half format: one roundHalf
// over the whole region, so a head's 64 columns of a fused q|k|v, each
// row shorter than the C loops' hand-over, still round in C.
func (o halfOperand) roundInto(dst []float32, rows, cols, ld int) {
	roundHalf(o.f16, dst, o.f, rows, cols, cols, ld)
}
