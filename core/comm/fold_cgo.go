//go:build cgo

package comm

/*
#cgo CFLAGS: -O3
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <immintrin.h>

// The sums of the shared-memory collectives: dst[i] = ((s0[i] + s1[i]) + s2[i]) + ...
// with source k at base + k*stride bytes, except source own, which is at
// mine when mine is not NULL (fold.go's srcs). Written so the C compiler
// vectorizes it (a private accumulator tile that nothing else aliases; no
// reassociation, so the order of the additions, and with it every bit of
// the result, is the one the Go fallback and the tcp path compute). dst
// may be one of the sources: each tile is read whole before it is written.
// Integers add as unsigned, which wraps as Go's int32 does.
#define TAC_TILE 2048
#define TAC_SRC(k) ((k) == own && mine ? mine : base + (size_t)(k) * stride)
#define TAC_FOLD(NAME, T)                                                        \
	__attribute__((target_clones("avx2", "default")))                           \
	void NAME(T* dst, const char* base, size_t stride, int nsrc, size_t n,      \
	          int own, const char* mine) {                                       \
		T acc[TAC_TILE];                                                         \
		for (size_t i0 = 0; i0 < n; i0 += TAC_TILE) {                            \
			size_t m = n - i0 < TAC_TILE ? n - i0 : TAC_TILE;                    \
			const T* a = (const T*)TAC_SRC(0) + i0;                              \
			const T* b = (const T*)TAC_SRC(1) + i0;                              \
			for (size_t i = 0; i < m; i++) acc[i] = a[i] + b[i];                 \
			for (int k = 2; k < nsrc; k++) {                                     \
				const T* s = (const T*)TAC_SRC(k) + i0;                          \
				for (size_t i = 0; i < m; i++) acc[i] += s[i];                   \
			}                                                                    \
			memcpy(dst + i0, acc, m * sizeof(T));                                \
		}                                                                        \
	}
TAC_FOLD(tac_fold_f32, float)
TAC_FOLD(tac_fold_f64, double)
TAC_FOLD(tac_fold_u32, uint32_t)

// The sums of half-precision folds (half.go): each source widened to float
// exactly, summed in float in source order, divided by div when div > 1
// (an average), rounded once to nearest even. bf16 is the top half of a
// float, so both directions are integer operations the compiler
// vectorizes; fp16 uses the F16C instructions (below).
static inline float tac_bf16_f32(uint16_t h) {
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}
static inline uint16_t tac_f32_bf16(float f) {
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(u >> 16) | 0x40;
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}
#define TAC_FOLD_HALF(NAME, CLONES, WIDEN, NARROW)                               \
	__attribute__((target_clones(CLONES, "default")))                           \
	void NAME(uint16_t* dst, const char* base, size_t stride, int nsrc, size_t n, int div) { \
		float acc[TAC_TILE];                                                     \
		for (size_t i0 = 0; i0 < n; i0 += TAC_TILE) {                            \
			size_t m = n - i0 < TAC_TILE ? n - i0 : TAC_TILE;                    \
			const uint16_t* a = (const uint16_t*)base + i0;                      \
			for (size_t i = 0; i < m; i++) acc[i] = WIDEN(a[i]);                 \
			for (int k = 1; k < nsrc; k++) {                                     \
				const uint16_t* s = (const uint16_t*)(base + (size_t)k * stride) + i0; \
				for (size_t i = 0; i < m; i++) acc[i] += WIDEN(s[i]);            \
			}                                                                    \
			if (div > 1) {                                                       \
				float d = (float)div;                                            \
				for (size_t i = 0; i < m; i++) acc[i] /= d;                      \
			}                                                                    \
			for (size_t i = 0; i < m; i++) dst[i0 + i] = NARROW(acc[i]);         \
		}                                                                        \
	}
TAC_FOLD_HALF(tac_fold_bf16, "avx2", tac_bf16_f32, tac_f32_bf16)

// fp16 through the F16C instructions (8 conversions at a time, rounding to
// nearest even); tac_fold_f16 returns 0 on a CPU without them, and the Go
// fold runs instead.
__attribute__((target("avx2,f16c")))
static void tac_fold_f16c(uint16_t* dst, const char* base, size_t stride, int nsrc, size_t n, int div) {
	float acc[TAC_TILE];
	for (size_t i0 = 0; i0 < n; i0 += TAC_TILE) {
		size_t m = n - i0 < TAC_TILE ? n - i0 : TAC_TILE, i;
		for (int k = 0; k < nsrc; k++) {
			const uint16_t* s = (const uint16_t*)(base + (size_t)k * stride) + i0;
			for (i = 0; i + 8 <= m; i += 8) {
				__m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(s + i)));
				_mm256_storeu_ps(acc + i, k == 0 ? v : _mm256_add_ps(_mm256_loadu_ps(acc + i), v));
			}
			for (; i < m; i++) acc[i] = k == 0 ? _cvtsh_ss(s[i]) : acc[i] + _cvtsh_ss(s[i]);
		}
		if (div > 1) {
			float d = (float)div;
			for (i = 0; i < m; i++) acc[i] /= d;
		}
		for (i = 0; i + 8 <= m; i += 8)
			_mm_storeu_si128((__m128i*)(dst + i0 + i), _mm256_cvtps_ph(_mm256_loadu_ps(acc + i), _MM_FROUND_TO_NEAREST_INT));
		for (; i < m; i++) dst[i0 + i] = _cvtss_sh(acc[i], _MM_FROUND_TO_NEAREST_INT);
	}
}
static int tac_fold_f16(uint16_t* dst, const char* base, size_t stride, int nsrc, size_t n, int div) {
	if (!__builtin_cpu_supports("f16c")) return 0;
	tac_fold_f16c(dst, base, stride, nsrc, n, div);
	return 1;
}

// The copies of an all-to-all (alltoall_shm.go): non-temporal stores,
// which write whole cache lines to memory without first reading them into
// the cache and without evicting what is there. The fence makes the bytes
// visible before the counter that announces them.
void tac_copy_nt(char* dst, const char* src, size_t n) {
	size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
	if (head > n) head = n;
	memcpy(dst, src, head);
	dst += head, src += head, n -= head;
	size_t i = 0;
	for (; i + 64 <= n; i += 64) {
		_mm_prefetch(src + i + 0x1c0, _MM_HINT_NTA);
		_mm_prefetch(src + i + 0x280, _MM_HINT_NTA);
		__m128i a = _mm_loadu_si128((const __m128i*)(src + i));
		__m128i b = _mm_loadu_si128((const __m128i*)(src + i + 16));
		__m128i c = _mm_loadu_si128((const __m128i*)(src + i + 32));
		__m128i d = _mm_loadu_si128((const __m128i*)(src + i + 48));
		_mm_stream_si128((__m128i*)(dst + i), a);
		_mm_stream_si128((__m128i*)(dst + i + 16), b);
		_mm_stream_si128((__m128i*)(dst + i + 32), c);
		_mm_stream_si128((__m128i*)(dst + i + 48), d);
	}
	memcpy(dst + i, src + i, n - i);
	_mm_sfence();
}
*/
import "C"

import (
	"unsafe"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// foldMin is the smallest fold worth a call into C; shorter ones run in Go.
const foldMin = 256

// foldSum sets dst to the sum of the sources (srcs), added in source
// order. The C code keeps no pointer past the call, so dst and mine may be
// Go memory; dst may be one of the sources.
func foldSum(dt tensor.DType, dst []byte, ss srcs) {
	if len(dst) < foldMin {
		foldSumGo(dt, dst, ss)
		return
	}
	d, b, s, k := unsafe.Pointer(&dst[0]), (*C.char)(ss.base), C.size_t(ss.stride), C.int(ss.n)
	own, mine := C.int(-1), (*C.char)(nil)
	if ss.mine != nil {
		own, mine = C.int(ss.own), (*C.char)(unsafe.Pointer(&ss.mine[0]))
	}
	switch dt {
	case tensor.Float32:
		C.tac_fold_f32((*C.float)(d), b, s, k, C.size_t(len(dst)/4), own, mine)
	case tensor.Float64:
		C.tac_fold_f64((*C.double)(d), b, s, k, C.size_t(len(dst)/8), own, mine)
	case tensor.Int32:
		C.tac_fold_u32((*C.uint32_t)(d), b, s, k, C.size_t(len(dst)/4), own, mine)
	}
}

// foldHalf sets the half dst to the fold of nsrc half sources, source k at
// base[k*stride:], by the rule of half.go: widened, combined in float32 in
// source order, divided by nsrc for Avg, rounded once. Sums and averages
// run in C; Max and Min, which round nothing, in Go. base may be Go memory:
// the C code keeps no pointer past the call.
func foldHalf(dt tensor.DType, op ReduceOp, dst []byte, base unsafe.Pointer, stride, nsrc int) {
	if len(dst) < foldMin || (op != Sum && op != Avg) {
		foldHalfGo(dt, op, dst, base, stride, nsrc)
		return
	}
	div := C.int(1)
	if op == Avg {
		div = C.int(nsrc)
	}
	d, b, s, k, n := (*C.uint16_t)(unsafe.Pointer(&dst[0])), (*C.char)(base), C.size_t(stride), C.int(nsrc), C.size_t(len(dst)/2)
	if dt == tensor.BFloat16 {
		C.tac_fold_bf16(d, b, s, k, n, div)
	} else if C.tac_fold_f16(d, b, s, k, n, div) == 0 {
		foldHalfGo(dt, op, dst, base, stride, nsrc)
	}
}

// copyNT copies src into dst (min of the lengths) with non-temporal stores
// (tac_copy_nt); copies shorter than foldMin run in Go.
func copyNT(dst, src []byte) {
	n := min(len(dst), len(src))
	if n < foldMin {
		copy(dst, src)
		return
	}
	C.tac_copy_nt((*C.char)(unsafe.Pointer(&dst[0])), (*C.char)(unsafe.Pointer(&src[0])), C.size_t(n))
}
