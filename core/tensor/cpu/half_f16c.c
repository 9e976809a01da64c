//go:build cgo && !purego

// Vectorised fp16 conversions for the cgo build, on the F16C instructions
// (VCVTPS2PH rounds 8 float32s to fp16 to nearest even, VCVTPH2PS widens
// 8 fp16s exactly), and the checks and roundings of the portable
// half-precision product (gemm_half.go). Each function gives bitwise the
// results of the Go loops of half.go: the instructions round as F16FromF32
// does, subnormals and ties included, and only NaNs differ (the
// instructions keep a NaN's payload and quiet it, where F16FromF32 makes
// the one quiet NaN of its sign and F16ToF32 keeps the payload as it is),
// so a group of 8 that holds a NaN is converted by the scalar forms below,
// which are the Go loops written in C. A CPU without F16C or AVX2 (checked
// once, tacc_f16c_supported) keeps the Go loops.

#include <immintrin.h>
#include <stdint.h>
#include "half_f16c.h"

#if defined(__x86_64__)

#define F16C __attribute__((target("avx2,f16c")))

int tacc_f16c_supported(void) {
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}

// f16_bits matches F16FromF32 in half.go.
static uint16_t f16_bits(uint32_t u) {
	uint16_t sign = (u >> 16) & 0x8000;
	uint32_t a = u & 0x7fffffff;
	if (a > 0x7f800000) {
		return sign | 0x7e00;
	}
	if (a >= 0x477ff000) {
		return sign | 0x7c00;
	}
	if (a >= 0x38800000) {
		a -= 112u << 23;
		a += 0xfff + ((a >> 13) & 1);
		return sign | (uint16_t)(a >> 13);
	}
	uint32_t e = a >> 23, s = 126 - e;
	if (s >= 25) {
		return sign;
	}
	uint32_t mant = (a & 0x7fffff) | 0x800000;
	uint32_t q = mant >> s, rem = mant & ((1u << s) - 1), half = 1u << (s - 1);
	if (rem > half || (rem == half && (q & 1))) {
		q++;
	}
	return sign | (uint16_t)q;
}

// f16_widen matches F16ToF32 in half.go, on bit patterns.
static uint32_t f16_widen(uint16_t h) {
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
	if (e == 0x1f) {
		return sign | 0x7f800000 | m << 13;
	}
	if (e == 0) {
		// m * 2^-24, exact: normalise m into a float32's significand
		if (m == 0) {
			return sign;
		}
		int sh = __builtin_clz(m) - 21; // shifts that bring m's top bit to bit 10
		return sign | (uint32_t)(113 - sh) << 23 | ((m << sh) & 0x3ff) << 13;
	}
	return sign | (e + 112) << 23 | m << 13;
}

// nan_lanes is a mask of the lanes of v (float32 bit patterns) that hold
// a NaN.
F16C static inline int nan_lanes(__m256i v) {
	__m256i a = _mm256_and_si256(v, _mm256_set1_epi32(0x7fffffff));
	return _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000))));
}

F16C void tacc_f16_from_f32(const uint32_t *src, uint16_t *dst, long n) {
	long i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256i v = _mm256_loadu_si256((const __m256i *)(src + i));
		if (nan_lanes(v)) {
			for (int j = 0; j < 8; j++) {
				dst[i + j] = f16_bits(src[i + j]);
			}
			continue;
		}
		_mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_castsi256_ps(v), _MM_FROUND_TO_NEAREST_INT));
	}
	for (; i < n; i++) {
		dst[i] = f16_bits(src[i]);
	}
}

F16C void tacc_f16_to_f32(const uint16_t *src, uint32_t *dst, long n) {
	long i = 0;
	for (; i + 8 <= n; i += 8) {
		__m128i h = _mm_loadu_si128((const __m128i *)(src + i));
		__m128i a = _mm_and_si128(h, _mm_set1_epi16(0x7fff));
		if (_mm_movemask_epi8(_mm_cmpgt_epi16(a, _mm_set1_epi16(0x7c00)))) {
			for (int j = 0; j < 8; j++) {
				dst[i + j] = f16_widen(src[i + j]);
			}
			continue;
		}
		_mm256_storeu_si256((__m256i *)(dst + i), _mm256_castps_si256(_mm256_cvtph_ps(h)));
	}
	for (; i < n; i++) {
		dst[i] = f16_widen(src[i]);
	}
}

F16C static inline void round_f16_row(const uint32_t *src, uint32_t *dst, long n) {
	long i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256i v = _mm256_loadu_si256((const __m256i *)(src + i));
		if (nan_lanes(v)) {
			for (int j = 0; j < 8; j++) {
				dst[i + j] = f16_widen(f16_bits(src[i + j]));
			}
			continue;
		}
		__m128i h = _mm256_cvtps_ph(_mm256_castsi256_ps(v), _MM_FROUND_TO_NEAREST_INT);
		_mm256_storeu_si256((__m256i *)(dst + i), _mm256_castps_si256(_mm256_cvtph_ps(h)));
	}
	for (; i < n; i++) {
		dst[i] = f16_widen(f16_bits(src[i]));
	}
}

F16C static inline int f16_exact_row(const uint32_t *src, long n) {
	long i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256i v = _mm256_loadu_si256((const __m256i *)(src + i));
		__m256i r = _mm256_castps_si256(_mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_castsi256_ps(v), _MM_FROUND_TO_NEAREST_INT)));
		if (nan_lanes(v) || _mm256_movemask_epi8(_mm256_cmpeq_epi32(v, r)) != -1) {
			return 0;
		}
	}
	for (; i < n; i++) {
		uint32_t a = src[i] & 0x7fffffff;
		if (a > 0x7f800000 || f16_widen(f16_bits(src[i])) != src[i]) {
			return 0;
		}
	}
	return 1;
}

// The 2-D forms work on rows x cols elements at row stride ld (an
// operand of a product inside a larger matrix) and leave the elements
// between the rows alone; the roundings read at row stride lds and write
// at row stride ldd, so a head's columns of a fused q|k|v round into a
// dense copy in one call.

F16C void tacc_round_f16_2d(const uint32_t *src, uint32_t *dst, long rows, long cols, long lds, long ldd) {
	for (long r = 0; r < rows; r++) {
		round_f16_row(src + r * lds, dst + r * ldd, cols);
	}
}

F16C int tacc_f16_exact_2d(const uint32_t *src, long rows, long cols, long ld) {
	for (long r = 0; r < rows; r++) {
		if (!f16_exact_row(src + r * ld, cols)) {
			return 0;
		}
	}
	return 1;
}

#else

int tacc_f16c_supported(void) { return 0; }
void tacc_f16_from_f32(const uint32_t *src, uint16_t *dst, long n) {}
void tacc_f16_to_f32(const uint16_t *src, uint32_t *dst, long n) {}
void tacc_round_f16_2d(const uint32_t *src, uint32_t *dst, long rows, long cols, long lds, long ldd) {}
int tacc_f16_exact_2d(const uint32_t *src, long rows, long cols, long ld) { return 0; }

#endif

// bf16_round matches BF16ToF32(BF16FromF32(u)) in half.go on bit patterns
// (the rounding of fastpath.c's bf16_bits), written without branches so
// the loops below vectorise.
static inline uint32_t bf16_round(uint32_t u) {
	uint32_t r = (u + 0x7fffu + ((u >> 16) & 1)) & 0xffff0000u;
	uint32_t nan = (u | 0x400000u) & 0xffff0000u;
	return (u & 0x7fffffffu) > 0x7f800000u ? nan : r;
}

#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

CLONES void tacc_round_bf16_2d(const uint32_t *src, uint32_t *dst, long rows, long cols, long lds, long ldd) {
	for (long r = 0; r < rows; r++) {
		const uint32_t *s = src + r * lds;
		uint32_t *d = dst + r * ldd;
		for (long i = 0; i < cols; i++) {
			d[i] = bf16_round(s[i]);
		}
	}
}

CLONES int tacc_bf16_exact_2d(const uint32_t *src, long rows, long cols, long ld) {
	// in blocks, so a float32 operand (almost never exact) stops at once
	// and an exact one is read at the vector rate
	for (long r = 0; r < rows; r++) {
		const uint32_t *s = src + r * ld;
		for (long i = 0; i < cols; i += 64) {
			long e = i + 64 < cols ? i + 64 : cols;
			uint32_t bad = 0;
			for (long j = i; j < e; j++) {
				bad |= (s[j] & 0xffffu) | ((s[j] & 0x7fffffffu) > 0x7f800000u);
			}
			if (bad) {
				return 0;
			}
		}
	}
	return 1;
}
