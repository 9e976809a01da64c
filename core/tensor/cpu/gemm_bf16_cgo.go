//go:build cgo && !purego

package cpu

/*
#cgo CFLAGS: -O3
#include "gemm_bf16.h"
*/
import "C"

import (
	"sync"
	"unsafe"
)

// bf16Native says the CPU has AVX512-BF16, so bf16 products run the kernel
// of gemm_bf16.c; checked once at start.
var bf16Native = C.tacc_bf16_supported() != 0

const (
	bf16NR = C.TACC_BF16_NR
	bf16MR = C.TACC_BF16_MR
	bf16MC = C.TACC_BF16_MC
	bf16KC = C.TACC_BF16_KC
)

// gemmBF16Native adds alpha*op(A)*op(B) to C (beta already applied), or
// with overwrite sets C to it without reading C (beta == 0). B is
// packed once into pair-interleaved panels, split over the threads by
// panel; then the threads take rows of C, each packing its own rows of A.
// Each element of C sees the same operations in the same order whatever
// the split, so the result does not depend on Threads().
func gemmBF16Native(transA, transB bool, m, n, k int, alpha float32, a halfOperand, lda int, b halfOperand, ldb int, overwrite bool, c []float32, ldc int) {
	kp := (k + 1) / 2
	panels := (n + bf16NR - 1) / bf16NR
	pb := getHalfBuf[uint16](&packedPool, panels*kp*2*bf16NR)
	defer packedPool.Put(pb)
	packed := *pb
	bp, bf32 := b.ptr()
	ParallelFor(panels, 1, func(lo, hi int) {
		C.tacc_bf16_pack_b(bp, bf32, cbool(transB), C.long(k), C.long(n), C.long(ldb),
			(*C.uint16_t)(&packed[0]), C.long(lo), C.long(hi))
	})
	ap, af32 := a.ptr()
	ParallelFor(m, 4*bf16MR, func(lo, hi int) {
		sb := getHalfBuf[uint32](&scratchPool, bf16MC*bf16KC) // this chunk's packed rows of A
		defer scratchPool.Put(sb)
		scratch := *sb
		C.tacc_bf16_gemm_rows((*C.uint16_t)(&packed[0]), C.long(k), C.long(n), ap, af32, cbool(transA), C.long(lda),
			C.long(lo), C.long(hi), C.float(alpha), (*C.float)(&c[0]), C.long(ldc), cbool(overwrite), (*C.uint32_t)(&scratch[0]))
	})
}

// gemmBF16Serial is gemmBF16Native run on the calling goroutine.
func gemmBF16Serial(transA, transB bool, m, n, k int, alpha float32, a halfOperand, lda int, b halfOperand, ldb int, overwrite bool, c []float32, ldc int) {
	kp := (k + 1) / 2
	panels := (n + bf16NR - 1) / bf16NR
	pb := getHalfBuf[uint16](&packedPool, panels*kp*2*bf16NR)
	defer packedPool.Put(pb)
	sb := getHalfBuf[uint32](&scratchPool, bf16MC*bf16KC)
	defer scratchPool.Put(sb)
	bp, bf32 := b.ptr()
	C.tacc_bf16_pack_b(bp, bf32, cbool(transB), C.long(k), C.long(n), C.long(ldb), (*C.uint16_t)(&(*pb)[0]), 0, C.long(panels))
	ap, af32 := a.ptr()
	C.tacc_bf16_gemm_rows((*C.uint16_t)(&(*pb)[0]), C.long(k), C.long(n), ap, af32, cbool(transA), C.long(lda),
		0, C.long(m), C.float(alpha), (*C.float)(&c[0]), C.long(ldc), cbool(overwrite), (*C.uint32_t)(&(*sb)[0]))
}

// packBF16Keys packs op(B) = X^T for X the n rows of k float32 numbers
// at x (stride ldx): what gemmBF16Serial packs for transB, once for
// products over any prefix of X's rows (gemmBF16Keys). Panel p of the
// packing holds the same numbers whatever n, so the first panels of one
// packing serve a smaller n.
func packBF16Keys(k, n int, x []float32, ldx int) *[]uint16 {
	kp := (k + 1) / 2
	panels := (n + bf16NR - 1) / bf16NR
	pb := getHalfBuf[uint16](&packedPool, panels*kp*2*bf16NR)
	C.tacc_bf16_pack_b(unsafe.Pointer(&x[0]), 1, 1, C.long(k), C.long(n), C.long(ldx), (*C.uint16_t)(&(*pb)[0]), 0, C.long(panels))
	return pb
}

// releaseBF16Keys gives a packing of packBF16Keys back.
func releaseBF16Keys(pb *[]uint16) { packedPool.Put(pb) }

// gemmBF16Keys sets C (m x n) to alpha*A*X[:n]^T on the calling goroutine,
// A float32 (m x k, stride lda) rounded as packed, X packed by
// packBF16Keys with at least n rows: bitwise gemmBF16Serial(false, true,
// ...) with beta 0 on X's first n rows.
func gemmBF16Keys(packed []uint16, m, n, k int, alpha float32, a []float32, lda int, c []float32, ldc int) {
	sb := getHalfBuf[uint32](&scratchPool, bf16MC*bf16KC)
	defer scratchPool.Put(sb)
	C.tacc_bf16_gemm_rows((*C.uint16_t)(&packed[0]), C.long(k), C.long(n), unsafe.Pointer(&a[0]), 1, 0, C.long(lda),
		0, C.long(m), C.float(alpha), (*C.float)(&c[0]), C.long(ldc), 1, (*C.uint32_t)(&(*sb)[0]))
}

// The packed operands are written in full before they are read, so their
// buffers are reused from call to call rather than allocated (and zeroed,
// and faulted in) for every product.
var packedPool, scratchPool sync.Pool

// getHalfBuf returns a slice of length n from pool, contents unspecified.
func getHalfBuf[T uint16 | uint32](pool *sync.Pool, n int) *[]T {
	if v, ok := pool.Get().(*[]T); ok && cap(*v) >= n {
		*v = (*v)[:n]
		return v
	}
	s := make([]T, n)
	return &s
}

// ptr returns the operand's storage and whether it is float32.
func (o halfOperand) ptr() (unsafe.Pointer, C.int) {
	if o.f != nil {
		return unsafe.Pointer(&o.f[0]), 1
	}
	return unsafe.Pointer(&o.h[0]), 0
}

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}
