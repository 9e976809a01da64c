//go:build !cgo || purego

package cpu

// Without cgo there is no bf16 kernel: bf16 products take the portable path.
const bf16Native = false

func gemmBF16Native(transA, transB bool, m, n, k int, alpha float32, a halfOperand, lda int, b halfOperand, ldb int, overwrite bool, c []float32, ldc int) {
	panic("cpu: no bf16 kernel in this build")
}

func gemmBF16NativeBias(transA, transB bool, m, n, k int, alpha float32, a halfOperand, lda int, b halfOperand, ldb int, overwrite bool, bias, c []float32, ldc int) {
	panic("cpu: no bf16 kernel in this build")
}

func gemmBF16Serial(transA, transB bool, m, n, k int, alpha float32, a halfOperand, lda int, b halfOperand, ldb int, overwrite bool, c []float32, ldc int) {
	panic("cpu: no bf16 kernel in this build")
}

func packBF16Keys(k, n int, x []float32, ldx int) *[]uint16 {
	panic("cpu: no bf16 kernel in this build")
}

func gemmBF16Keys(packed []uint16, m, n, k int, alpha float32, a []float32, lda int, c []float32, ldc int) {
	panic("cpu: no bf16 kernel in this build")
}

func releaseBF16Keys(pb *[]uint16) {}

func packBF16Rows(rows, cols int, x []float32, ldx int) *[]uint16 {
	panic("cpu: no bf16 kernel in this build")
}

func gemmBF16Rows(packed []uint16, rows, cols, r0, k, m int, transA bool, alpha float32, a []float32, lda int, overwrite bool, c []float32, ldc int) {
	panic("cpu: no bf16 kernel in this build")
}
