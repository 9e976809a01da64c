package cpu

import "fmt"

// GemmRoundAHalfBBias is GemmRoundAHalfB with beta 0 followed by adding
// bias[j] to column j of each of C's m rows (AddBias), bitwise the same as
// the two calls in turn: a Linear layer's forward with a bias. On the bf16
// kernel the bias is added to each tile of C as its last sum is stored,
// while the tile is in cache, rather than in a second pass over C; the
// portable path makes the two calls.
func GemmRoundAHalfBBias(f16, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []uint16, ldb int, bias, c []float32, ldc int) {
	checkGemm(transA, transB, m, n, k, len(a), lda, len(b), ldb, len(c), ldc)
	if len(bias) < n {
		panic(fmt.Sprintf("cpu.GemmRoundAHalfBBias: bias has %d numbers for %d columns", len(bias), n))
	}
	ao, bo := halfOperand{f: a, f16: f16}, halfOperand{h: b, f16: f16}
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
