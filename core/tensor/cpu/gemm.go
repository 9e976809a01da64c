package cpu

import "fmt"

// checkGemm panics with a message naming the offending argument when the
// shapes, strides or slice lengths of a Gemm call are inconsistent. A BLAS
// library would otherwise read or write out of bounds (or print an error and
// carry on), so the check runs before every call; it is a handful of integer
// comparisons against calls that do at least m*n*k work.
func checkGemm(transA, transB bool, m, n, k, lenA, lda, lenB, ldb, lenC, ldc int) {
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("cpu.Gemm: negative size m=%d n=%d k=%d", m, n, k))
	}
	check := func(name string, rows, cols, ld, length int) {
		if rows == 0 || cols == 0 {
			return
		}
		if ld < cols {
			panic(fmt.Sprintf("cpu.Gemm: %s is stored %dx%d but its row stride ld%s=%d is below %d; pass the stored row length",
				name, rows, cols, name, ld, cols))
		}
		if need := (rows-1)*ld + cols; length < need {
			panic(fmt.Sprintf("cpu.Gemm: %s is stored %dx%d with row stride %d, which needs %d elements, but the slice has %d",
				name, rows, cols, ld, need, length))
		}
	}
	ar, ac := m, k
	if transA {
		ar, ac = k, m
	}
	br, bc := k, n
	if transB {
		br, bc = n, k
	}
	check("a", ar, ac, lda, lenA)
	check("b", br, bc, ldb, lenB)
	check("c", m, n, ldc, lenC)
}

// scaleC applies C = beta*C ahead of an accumulation. As in BLAS, beta == 0
// overwrites C without reading it, so NaNs in an uninitialised C vanish.
func scaleC[T Float](m, n int, beta T, c []T, ldc int) {
	if beta == 1 {
		return
	}
	for i := 0; i < m; i++ {
		row := c[i*ldc : i*ldc+n]
		if beta == 0 {
			clear(row)
			continue
		}
		for j := range row {
			row[j] *= beta
		}
	}
}
