//go:build cgo && !purego

package cpu

/*
#cgo LDFLAGS: -lopenblas
#include <cblas.h>
*/
import "C"

import "unsafe"

// Gemm computes C = alpha*op(A)*op(B) + beta*C on row-major matrices, where
// op(X) is X or its transpose. After op, A is m x k, B is k x n and C is
// m x n; lda, ldb and ldc are the row strides of the matrices as stored, so
// a sub-matrix (one attention head inside a fused qkv row) is passed as a
// slice starting at its first element with the parent's row stride. As in
// BLAS, beta == 0 overwrites C without reading it.
//
// This build calls OpenBLAS (cblas_sgemm / cblas_dgemm) through cgo. The
// calls are large enough that the cgo transition is noise.
func Gemm[T Float](transA, transB bool, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int) {
	checkGemm(transA, transB, m, n, k, len(a), lda, len(b), ldb, len(c), ldc)
	defer threadedBLAS()()
	gemmBLAS(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// gemmBLAS is Gemm without the argument check and without taking the BLAS
// mode (threads.go); kernels inside serialBLAS call it.
func gemmBLAS[T Float](transA, transB bool, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	if k == 0 {
		// Some BLAS builds reject k == 0 with lda < 1; the answer is just beta*C.
		scaleC(m, n, beta, c, ldc)
		return
	}
	ta, tb := C.enum_CBLAS_TRANSPOSE(C.CblasNoTrans), C.enum_CBLAS_TRANSPOSE(C.CblasNoTrans)
	if transA {
		ta = C.CblasTrans
	}
	if transB {
		tb = C.CblasTrans
	}
	if isF32[T]() {
		C.cblas_sgemm(C.CblasRowMajor, ta, tb, C.blasint(m), C.blasint(n), C.blasint(k),
			C.float(alpha), (*C.float)(unsafe.Pointer(&a[0])), C.blasint(lda),
			(*C.float)(unsafe.Pointer(&b[0])), C.blasint(ldb),
			C.float(beta), (*C.float)(unsafe.Pointer(&c[0])), C.blasint(ldc))
		return
	}
	C.cblas_dgemm(C.CblasRowMajor, ta, tb, C.blasint(m), C.blasint(n), C.blasint(k),
		C.double(alpha), (*C.double)(unsafe.Pointer(&a[0])), C.blasint(lda),
		(*C.double)(unsafe.Pointer(&b[0])), C.blasint(ldb),
		C.double(beta), (*C.double)(unsafe.Pointer(&c[0])), C.blasint(ldc))
}

// BLASName reports which implementation Gemm uses: "openblas" in this build.
func BLASName() string { return "openblas" }

// blasSetThreads sets OpenBLAS's thread count; callers go through
// setBLASThreads and serialBLAS (threads.go).
func blasSetThreads(n int) { C.openblas_set_num_threads(C.int(n)) }
