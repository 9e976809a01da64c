package cpu

// Operands formed once for several half-precision products. A Linear's
// backward reads its output gradient dY in two products, dX = dY·Wᵀ and
// dW = Xᵀ·dY. The bf16 kernel rounds a float32 operand as it packs it, at
// no cost of its own; the portable path rounds it into a float32 copy
// before the float32 product runs, a pass over the operand per product.
// RoundHalfOnce makes that pass once for every product that reads the
// operand, and GemmHalfOperands reads the rounded copy as it is.

// HalfOperand is one operand of GemmHalfOperands: the half format's bits
// (H), or float32 numbers (F) that the product rounds as it reads them,
// unless Exact says they already hold half values (RoundHalfOnce), which
// the portable path reads as they are.
type HalfOperand struct {
	F     []float32
	H     []uint16
	Exact bool
}

// GemmHalfOperands computes C = alpha*op(A)*op(B) + beta*C in bf16 (fp16
// when f16) with float32 accumulation, like GemmRoundBF16 and its kin
// (which of them depends on which operands are H and which F): the same
// result, bitwise, whether an operand comes rounded once (Exact) or not.
func GemmHalfOperands(f16, transA, transB bool, m, n, k int, alpha float32, a HalfOperand, lda int, b HalfOperand, ldb int, beta float32, c []float32, ldc int) {
	ao := halfOperand{f: a.F, h: a.H, f16: f16, exact: a.Exact}
	bo := halfOperand{f: b.F, h: b.H, f16: f16, exact: b.Exact}
	// the kernel rounds as it packs, where an exact operand's rounding
	// changes none of its bits; the portable path reads it as it is
	gemmHalf(transA, transB, m, n, k, alpha, ao, lda, bo, ldb, beta, c, ldc)
}

// RoundHalfOnce returns x, a dense rows x cols float32 matrix, as an
// operand that several half-precision products (GemmHalfOperands) read,
// and the function that gives its storage back once they are done. On
// the portable path it is x rounded to bf16 (fp16 when f16) once, into a
// buffer reused from product to product (or x itself when it already
// holds half values), marked Exact; with the bf16 kernel, which rounds
// as it packs, x itself, unrounded.
func RoundHalfOnce(f16 bool, x []float32, rows, cols int) (HalfOperand, func()) {
	if HalfKernel(f16) || rows == 0 || cols == 0 {
		return HalfOperand{F: x}, func() {}
	}
	w, buf := halfOperand{f: x, f16: f16}.widen(false, rows, cols, cols, true)
	return HalfOperand{F: w, Exact: true}, func() { putWidenBuf(buf) }
}

// HalfKernel reports whether products in bf16 (fp16 when f16) run a
// kernel of half-precision instructions now (the bf16 kernel: HalfGemmPath
// says "avx512bf16") rather than the portable float32 path.
func HalfKernel(f16 bool) bool { return !f16 && bf16Kernel.Load() }

// Strip is the operand from element off on: where a block of columns of a
// matrix with a longer row stride starts (one projection's columns of
// fused outputs).
func (o HalfOperand) Strip(off int) HalfOperand {
	if o.F != nil {
		o.F = o.F[off:]
	}
	if o.H != nil {
		o.H = o.H[off:]
	}
	return o
}
