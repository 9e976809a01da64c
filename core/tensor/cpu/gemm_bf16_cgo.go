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
// with overwrite sets C to it without reading C (beta == 0). It runs the
// product over blocks of op(B) of at most packLimit packed bytes
// (packBlock), columns outer and k inner, so the buffer a product packs
// into is bounded whatever its shape: the tied head's 50257 x 512 would
// otherwise pack whole, 49 MiB of garbage per call beside the tensors.
// Blocks start at multiples of the panel width and of the kernel's k
// block, so each element of C sees the same operations in the same order
// as unblocked: the kernel sums each block of bf16KC pairs from zero and
// adds it to C in k order, and only the first block overwrites.
func gemmBF16Native(transA, transB bool, m, n, k int, alpha float32, a halfOperand, lda int, b halfOperand, ldb int, overwrite bool, c []float32, ldc int) {
	gemmBF16NativeBias(transA, transB, m, n, k, alpha, a, lda, b, ldb, overwrite, nil, c, ldc)
}

// gemmBF16NativeBias is gemmBF16Native followed by adding bias[j] (n
// numbers; nil for none) to column j of every row of C, as AddBias does,
// bitwise: the kernel adds it to each tile of C as the tile's last k
// block is stored (the last k block of op(B) when it is packed in
// blocks), while the tile is in cache.
func gemmBF16NativeBias(transA, transB bool, m, n, k int, alpha float32, a halfOperand, lda int, b halfOperand, ldb int, overwrite bool, bias, c []float32, ldc int) {
	nb, kb := packBlock(n, k, packLimit)
	for j0 := 0; j0 < n; j0 += nb {
		nn := min(nb, n-j0)
		for k0 := 0; k0 < k; k0 += kb {
			kk := min(kb, k-k0)
			// op(A)'s columns k0.. and op(B)'s block at (k0, j0)
			ao, bo := k0, k0*ldb+j0
			if transA {
				ao = k0 * lda
			}
			if transB {
				bo = j0*ldb + k0
			}
			var bb []float32
			if bias != nil && k0+kk == k {
				bb = bias[j0:]
			}
			gemmBF16Block(transA, transB, m, nn, kk, alpha, a.from(ao), lda, b.from(bo), ldb, overwrite && k0 == 0, bb, c[j0:], ldc)
		}
	}
}

// packLimit bounds the bytes of op(B) one product packs at once
// (packBlock); a variable so tests can force blocking at small shapes.
var packLimit = 4 << 20

// packBlock returns the columns nb and depth kb of the blocks of op(B)
// (k x n) that gemmBF16Native packs one at a time, within limit bytes: the
// whole of op(B) where it fits; else kb the whole k, or, past what leaves
// room for 16 panels, a multiple of the kernel's k block (2*bf16KC
// numbers), and nb as many panels as then fit. A block is at least one
// panel of one k block.
func packBlock(n, k, limit int) (nb, kb int) {
	if 2*packedLen(n, k) <= limit {
		return n, k
	}
	const step = 2 * bf16KC
	kb = min(k, max(step, limit/(2*16*bf16NR)/step*step))
	panels := max(1, limit/(2*packedLen(bf16NR, kb)))
	return min(n, panels*bf16NR), kb
}

// packedLen is the uint16 length of op(B) (k x n) packed into panels:
// ceil(n/NR) panels of ceil(k/2) pairs of NR lanes.
func packedLen(n, k int) int {
	return (n + bf16NR - 1) / bf16NR * ((k + 1) / 2) * 2 * bf16NR
}

// gemmBF16Block is one block of gemmBF16Native. op(B) is packed into
// pair-interleaved panels, split over the threads by panel; then the
// threads take rows of C, each packing its own rows of A. Each element of
// C sees the same operations in the same order whatever the split, so the
// result does not depend on Threads().
func gemmBF16Block(transA, transB bool, m, n, k int, alpha float32, a halfOperand, lda int, b halfOperand, ldb int, overwrite bool, bias, c []float32, ldc int) {
	panels := (n + bf16NR - 1) / bf16NR
	pb := getHalfBuf[uint16](&packedPool, packedLen(n, k))
	defer packedPool.Put(pb)
	packed := *pb
	bp, bf32 := b.ptr()
	ParallelFor(panels, 1, func(lo, hi int) {
		C.tacc_bf16_pack_b(bp, bf32, cbool(transB), C.long(k), C.long(n), C.long(ldb),
			(*C.uint16_t)(&packed[0]), C.long(lo), C.long(hi))
	})
	ap, af32 := a.ptr()
	var bp32 *C.float // the bias, or NULL
	if bias != nil {
		bp32 = (*C.float)(&bias[0])
	}
	ParallelFor(m, 4*bf16MR, func(lo, hi int) {
		sb := getHalfBuf[uint32](&scratchPool, bf16MC*bf16KC) // this chunk's packed rows of A
		defer scratchPool.Put(sb)
		scratch := *sb
		C.tacc_bf16_gemm_rows((*C.uint16_t)(&packed[0]), C.long((k+1)/2), C.long(k), C.long(n), ap, af32, cbool(transA), C.long(lda),
			C.long(lo), C.long(hi), C.float(alpha), (*C.float)(&c[0]), C.long(ldc), cbool(overwrite), bp32, (*C.uint32_t)(&scratch[0]))
	})
}

// gemmBF16Serial is gemmBF16Block run on the calling goroutine, unblocked:
// the attention's per-head products, whose op(B) (context x head width)
// is far below packLimit.
func gemmBF16Serial(transA, transB bool, m, n, k int, alpha float32, a halfOperand, lda int, b halfOperand, ldb int, overwrite bool, c []float32, ldc int) {
	panels := (n + bf16NR - 1) / bf16NR
	pb := getHalfBuf[uint16](&packedPool, packedLen(n, k))
	defer packedPool.Put(pb)
	sb := getHalfBuf[uint32](&scratchPool, bf16MC*bf16KC)
	defer scratchPool.Put(sb)
	bp, bf32 := b.ptr()
	C.tacc_bf16_pack_b(bp, bf32, cbool(transB), C.long(k), C.long(n), C.long(ldb), (*C.uint16_t)(&(*pb)[0]), 0, C.long(panels))
	ap, af32 := a.ptr()
	C.tacc_bf16_gemm_rows((*C.uint16_t)(&(*pb)[0]), C.long((k+1)/2), C.long(k), C.long(n), ap, af32, cbool(transA), C.long(lda),
		0, C.long(m), C.float(alpha), (*C.float)(&c[0]), C.long(ldc), cbool(overwrite), nil, (*C.uint32_t)(&(*sb)[0]))
}

// packBF16Keys packs op(B) = X^T for X the n rows of k float32 numbers
// at x (stride ldx): what gemmBF16Serial packs for transB, once for
// products over any prefix of X's rows (gemmBF16Keys). Panel p of the
// packing holds the same numbers whatever n, so the first panels of one
// packing serve a smaller n.
func packBF16Keys(k, n int, x []float32, ldx int) *[]uint16 {
	panels := (n + bf16NR - 1) / bf16NR
	pb := getHalfBuf[uint16](&packedPool, packedLen(n, k))
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
	C.tacc_bf16_gemm_rows((*C.uint16_t)(&packed[0]), C.long((k+1)/2), C.long(k), C.long(n), unsafe.Pointer(&a[0]), 1, 0, C.long(lda),
		0, C.long(m), C.float(alpha), (*C.float)(&c[0]), C.long(ldc), 1, nil, (*C.uint32_t)(&(*sb)[0]))
}

// packBF16Rows packs op(B) = X for X the rows rows of cols float32
// numbers at x (stride ldx): what gemmBF16Serial packs for !transB, once
// for products over any run of X's rows from an even row (gemmBF16Rows).
// The pairs of rows 2q and 2q+1 are the same numbers in every packing
// that holds them, so a packing of all the rows serves each run.
func packBF16Rows(rows, cols int, x []float32, ldx int) *[]uint16 {
	panels := (cols + bf16NR - 1) / bf16NR
	pb := getHalfBuf[uint16](&packedPool, packedLen(cols, rows))
	C.tacc_bf16_pack_b(unsafe.Pointer(&x[0]), 1, 0, C.long(rows), C.long(cols), C.long(ldx), (*C.uint16_t)(&(*pb)[0]), 0, C.long(panels))
	return pb
}

// gemmBF16Rows adds alpha*op(A)*X[r0:r0+k] to C (m x cols; with overwrite,
// sets C to it) on the calling goroutine, A float32 rounded as packed, X
// packed by packBF16Rows with rows rows, r0 even: bitwise gemmBF16Serial
// on those k rows when r0+k is even or the end of X, so that the last
// pair holds the same numbers as a packing of the k rows alone.
func gemmBF16Rows(packed []uint16, rows, cols, r0, k, m int, transA bool, alpha float32, a []float32, lda int, overwrite bool, c []float32, ldc int) {
	sb := getHalfBuf[uint32](&scratchPool, bf16MC*bf16KC)
	defer scratchPool.Put(sb)
	C.tacc_bf16_gemm_rows((*C.uint16_t)(&packed[r0/2*2*bf16NR]), C.long((rows+1)/2), C.long(k), C.long(cols), unsafe.Pointer(&a[0]), 1, cbool(transA), C.long(lda),
		0, C.long(m), C.float(alpha), (*C.float)(&c[0]), C.long(ldc), cbool(overwrite), nil, (*C.uint32_t)(&(*sb)[0]))
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
