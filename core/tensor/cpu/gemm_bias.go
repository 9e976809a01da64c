package cpu

import "fmt"

// GemmRoundAHalfBBias is GemmRoundAHalfB with beta 0 followed by adding
// bias[j] to column j of each of C's m rows (AddBias), bitwise the same as
// the two calls in turn: a Linear layer's forward with a bias. On the bf16
// kernel the bias is added to each tile of C as its last sum is stored,
// while the tile is in cache, rather than in a second pass over C; the
// portable path makes the two calls.
func GemmRoundAHalfBBias(f16, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []uint16, ldb int, bias, c []float32, ldc int) {
	gemmHalfBias("GemmRoundAHalfBBias", f16, transA, transB, m, n, k, alpha, halfOperand{f: a, f16: f16}, lda, b, ldb, bias, c, ldc)
}

// GemmHalfOperandBias is GemmRoundAHalfBBias with A a HalfOperand: float32
// rounded as read, or already in the half format (H), as a Linear's input
// narrowed once for the product and for the copy kept for the backward.
// The result is bitwise that of GemmRoundAHalfBBias on the float32 A the
// halves were rounded from.
func GemmHalfOperandBias(f16, transA, transB bool, m, n, k int, alpha float32, a HalfOperand, lda int, b []uint16, ldb int, bias, c []float32, ldc int) {
	gemmHalfBias("GemmHalfOperandBias", f16, transA, transB, m, n, k, alpha, halfOperand{f: a.F, h: a.H, f16: f16, exact: a.Exact}, lda, b, ldb, bias, c, ldc)
}

func gemmHalfBias(name string, f16, transA, transB bool, m, n, k int, alpha float32, ao halfOperand, lda int, b []uint16, ldb int, bias, c []float32, ldc int) {
	checkGemm(transA, transB, m, n, k, ao.len(), lda, len(b), ldb, len(c), ldc)
	if len(bias) < n {
		panic(fmt.Sprintf("cpu.%s: bias has %d numbers for %d columns", name, len(bias), n))
	}
	bo := halfOperand{h: b, f16: f16}
	if bf16Kernel.Load() && !f16 && m > 0 && n > 0 && k > 0 {
		gemmBF16NativeBias(transA, transB, m, n, k, alpha, ao, lda, bo, ldb, true, bias[:n], c, ldc)
		return
	}
	gemmHalf(transA, transB, m, n, k, alpha, ao, lda, bo, ldb, 0, c, ldc)
	if m == 0 || n == 0 {
		return
	}
	if ldc == n {
		AddBias(c[:m*n], bias[:n], m, n)
		return
	}
	for r := range m {
		AddBias(c[r*ldc:r*ldc+n], bias[:n], 1, n)
	}
}
