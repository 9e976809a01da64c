//go:build !cgo || purego

package cpu

// Gemm computes C = alpha*op(A)*op(B) + beta*C on row-major matrices, where
// op(X) is X or its transpose. After op, A is m x k, B is k x n and C is
// m x n; lda, ldb and ldc are the row strides of the matrices as stored, so
// a sub-matrix (one attention head inside a fused qkv row) is passed as a
// slice starting at its first element with the parent's row stride. As in
// BLAS, beta == 0 overwrites C without reading it.
//
// This build has no BLAS library (cgo is off or the purego tag is set), so
// the pure-Go kernel runs.
func Gemm[T Float](transA, transB bool, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int) {
	checkGemm(transA, transB, m, n, k, len(a), lda, len(b), ldb, len(c), ldc)
	gemmGo(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// gemmBLAS is Gemm without the argument check (the name matches the
// OpenBLAS build, where it also skips taking the BLAS mode).
func gemmBLAS[T Float](transA, transB bool, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int) {
	gemmGo(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// BLASName reports which implementation Gemm uses: "go" in this build.
func BLASName() string { return "go" }

// blasSetThreads has no library to configure in this build.
func blasSetThreads(int) {}
