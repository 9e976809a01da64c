package cpu

// Half-precision matrix products: the operands hold bfloat16 or fp16
// numbers, the products accumulate in float32 and C is float32, the
// recipe of mixed-precision training (tensor cores and CPUs' bf16
// instructions do the same).
//
// Which path a CPU gets (HalfGemmPath says):
//   - bf16 on a CPU with AVX512-BF16 in the cgo build: the kernel of
//     gemm_bf16.c on VDPBF16PS, which multiplies bf16 pairs and adds them
//     to float32 lanes at twice the float32 FMA rate;
//   - bf16 elsewhere, and fp16 everywhere: the operands are widened to
//     float32 (exactly: every half is a float32) and the float32 Gemm
//     runs, so the products are exact and the sums are float32 sums.
//     fp16 has no fast path here: x86 CPUs without AVX512-FP16 have only
//     conversions for it.

// halfOperand is one operand of a half-precision product: stored as 16-bit
// patterns (h), or as float32 (f) that the product rounds to the half
// format first, so callers with float32 activations need no converted copy.
type halfOperand struct {
	h   []uint16
	f   []float32
	f16 bool // the format is fp16 rather than bf16
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

// GemmHalfARoundB is GemmRoundAHalfB with the roles swapped: A stored in
// the half format (an activation kept in 2 bytes for the backward, read
// as stored), B float32 rounded as it is read (an output gradient). The
// result is bitwise that of GemmRoundBF16 (GemmRoundF16 when f16) on the
// float32 A the copy was rounded from.
func GemmHalfARoundB(f16, transA, transB bool, m, n, k int, alpha float32, a []uint16, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	gemmHalf(transA, transB, m, n, k, alpha, halfOperand{h: a, f16: f16}, lda, halfOperand{f: b, f16: f16}, ldb, beta, c, ldc)
}

// GemmF16 computes C = alpha*op(A)*op(B) + beta*C, with A and B holding
// IEEE fp16 numbers and C float32.
func GemmF16(transA, transB bool, m, n, k int, alpha float32, a []uint16, lda int, b []uint16, ldb int, beta float32, c []float32, ldc int) {
	gemmHalf(transA, transB, m, n, k, alpha, halfOperand{h: a, f16: true}, lda, halfOperand{h: b, f16: true}, ldb, beta, c, ldc)
}

// HalfGemmPath names the path GemmBF16 takes on this CPU and build:
// "avx512bf16" or "float32 <BLASName>".
func HalfGemmPath() string {
	if bf16Native {
		return "avx512bf16"
	}
	return "float32 " + BLASName()
}

func gemmHalf(transA, transB bool, m, n, k int, alpha float32, a halfOperand, lda int, b halfOperand, ldb int, beta float32, c []float32, ldc int) {
	checkGemm(transA, transB, m, n, k, a.len(), lda, b.len(), ldb, len(c), ldc)
	if bf16Native && !a.f16 && !b.f16 && m > 0 && n > 0 && k > 0 {
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
// run the float32 Gemm.
func gemmHalfWiden(transA, transB bool, m, n, k int, alpha float32, a halfOperand, lda int, b halfOperand, ldb int, beta float32, c []float32, ldc int) {
	Gemm(transA, transB, m, n, k, alpha, a.widen(), lda, b.widen(), ldb, beta, c, ldc)
}

// widen returns the operand's numbers as float32 in a new slice.
func (o halfOperand) widen() []float32 {
	out := make([]float32, o.len())
	switch {
	case o.f != nil && o.f16:
		copy(out, o.f)
		RoundF16(out)
	case o.f != nil:
		copy(out, o.f)
		RoundBF16(out)
	case o.f16:
		F16ToF32s(out, o.h)
	default:
		BF16ToF32s(out, o.h)
	}
	return out
}

// gemmRoundBF16Serial is GemmRoundBF16(false, true, ...) with beta 0 on
// the calling goroutine only, for the attention's per-head score products,
// which run inside a head-parallel loop that holds the BLAS library
// single-threaded (serialBLAS): the portable path calls gemmBLAS.
func gemmRoundBF16Serial(m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	checkGemm(false, true, m, n, k, len(a), lda, len(b), ldb, len(c), ldc)
	if m == 0 || n == 0 {
		return
	}
	ao, bo := halfOperand{f: a}, halfOperand{f: b}
	if bf16Native && k > 0 {
		gemmBF16Serial(m, n, k, alpha, ao, lda, bo, ldb, c, ldc)
		return
	}
	gemmBLAS(false, true, m, n, k, alpha, ao.widen(), lda, bo.widen(), ldb, 0, c, ldc)
}
