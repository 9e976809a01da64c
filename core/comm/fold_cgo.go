//go:build cgo

package comm

/*
#cgo CFLAGS: -O3
#include <stddef.h>
#include <stdint.h>
#include <string.h>

// The sums of the shared-memory collectives: dst[i] = ((s0[i] + s1[i]) + s2[i]) + ...
// with source k at base + k*stride bytes. Written so the C compiler
// vectorizes it (a private accumulator tile that nothing else aliases; no
// reassociation, so the order of the additions, and with it every bit of
// the result, is the one the Go fallback and the tcp path compute). dst
// may be one of the sources: each tile is read whole before it is written.
// Integers add as unsigned, which wraps as Go's int32 does.
#define TAC_TILE 2048
#define TAC_FOLD(NAME, T)                                                        \
	__attribute__((target_clones("avx2", "default")))                           \
	void NAME(T* dst, const char* base, size_t stride, int nsrc, size_t n) {     \
		T acc[TAC_TILE];                                                         \
		for (size_t i0 = 0; i0 < n; i0 += TAC_TILE) {                            \
			size_t m = n - i0 < TAC_TILE ? n - i0 : TAC_TILE;                    \
			const T* a = (const T*)base + i0;                                    \
			const T* b = (const T*)(base + stride) + i0;                         \
			for (size_t i = 0; i < m; i++) acc[i] = a[i] + b[i];                 \
			for (int k = 2; k < nsrc; k++) {                                     \
				const T* s = (const T*)(base + (size_t)k * stride) + i0;         \
				for (size_t i = 0; i < m; i++) acc[i] += s[i];                   \
			}                                                                    \
			memcpy(dst + i0, acc, m * sizeof(T));                                \
		}                                                                        \
	}
TAC_FOLD(tac_fold_f32, float)
TAC_FOLD(tac_fold_f64, double)
TAC_FOLD(tac_fold_u32, uint32_t)
*/
import "C"

import (
	"unsafe"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// foldMin is the smallest fold worth a call into C; shorter ones run in Go.
const foldMin = 256

// foldSum sets dst to the sum of nsrc equally long sources, source k at
// base[k*stride:], added in source order. base is shared memory (never Go
// memory, so the C code may hold it); dst may be either.
func foldSum(dt tensor.DType, dst []byte, base unsafe.Pointer, stride, nsrc int) {
	if len(dst) < foldMin {
		foldSumGo(dt, dst, base, stride, nsrc)
		return
	}
	d, b, s, k := unsafe.Pointer(&dst[0]), (*C.char)(base), C.size_t(stride), C.int(nsrc)
	switch dt {
	case tensor.Float32:
		C.tac_fold_f32((*C.float)(d), b, s, k, C.size_t(len(dst)/4))
	case tensor.Float64:
		C.tac_fold_f64((*C.double)(d), b, s, k, C.size_t(len(dst)/8))
	case tensor.Int32:
		C.tac_fold_u32((*C.uint32_t)(d), b, s, k, C.size_t(len(dst)/4))
	}
}
