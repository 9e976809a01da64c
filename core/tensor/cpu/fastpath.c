//go:build cgo && !purego

// Vectorised float32 loops for the cgo build. Each function mirrors a Go
// loop (in fastpath.go, half.go, attention_pos.go and vec.go) operation for
// operation: the same formulas, the same
// evaluation order, no fused multiply-add (-ffp-contract=off) and sums kept
// in sumLanes partial sums combined in a fixed order. So every CPU variant
// below, and the pure-Go build, produce bitwise the same results; the C
// compiler only gets to run several elements per instruction.

// Never fuse a*b+c: the Go loops round after every operation.
#pragma GCC optimize("fp-contract=off")

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "fastpath.h"

// One clone per instruction set, picked once at load time.
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

#define SUM_LANES 16

// reduce_lanes matches reduceLanes in layernorm.go.
static inline float reduce_lanes(float *acc) {
	for (int w = SUM_LANES / 2; w > 0; w /= 2) {
		for (int j = 0; j < w; j++) {
			acc[j] += acc[j + w];
		}
	}
	return acc[0];
}

// exp_core matches expCore in fastmath.go.
static inline float exp_core(float x) {
	float t = x * 1.4426950408889634f + 12582912.0f;
	float n = t - 12582912.0f;
	float r = x - n * 0.693359375f;
	r -= n * -2.12194440e-4f;
	float p = (((((0.0013836829457432032f * r + 0.008374815806746483f) * r + 0.04166822507977486f) * r +
		     0.16666419804096222f) * r + 0.49999991059303284f) * r + 1.0f) * r + 1.0f;
	uint32_t pb, tb;
	memcpy(&pb, &p, 4);
	memcpy(&tb, &t, 4);
	pb += tb << 23;
	memcpy(&p, &pb, 4);
	return p;
}

// gelu_exp matches the clamped exponent of geluFwd32/geluBwd32.
static inline float gelu_exp(float v) {
	float z = -1.5957691216057308f * (v + 0.044715f * v * v * v);
	z = z < -87.33654f ? -87.33654f : (z > 80.0f ? 80.0f : z);
	return exp_core(z);
}

CLONES void tacc_gelu_fwd(const float *x, float *y, long n) {
	for (long i = 0; i < n; i++) {
		float v = x[i];
		y[i] = v / (1.0f + gelu_exp(v));
	}
}

// gelu_bwd_term is dy * gelu'(v), as geluBwd32Go adds it.
static inline float gelu_bwd_term(float v, float dy) {
	float e = gelu_exp(v);
	float s = 1.0f / (1.0f + e);
	return (dy * s) * (1.0f + (((1.5957691216057308f * v) * (1.0f + (0.134145f * v) * v)) * e) * s);
}

CLONES void tacc_gelu_bwd(const float *restrict x, const float *restrict dy, float *restrict dx, long n) {
	for (long i = 0; i < n; i++) {
		dx[i] += gelu_bwd_term(x[i], dy[i]);
	}
}

// tacc_gelu_bwd_bf16 is tacc_gelu_bwd on x held as bfloat16 bits, each
// widened exactly as it is read (geluBwdBF16Go).
CLONES void tacc_gelu_bwd_bf16(const uint16_t *restrict x, const float *restrict dy, float *restrict dx, long n) {
	for (long i = 0; i < n; i++) {
		uint32_t u = (uint32_t)x[i] << 16;
		float v;
		memcpy(&v, &u, 4);
		dx[i] += gelu_bwd_term(v, dy[i]);
	}
}

// softmax_row matches softmaxRow32 in fastpath.go.
// The maximum is taken in SUM_LANES running maxima, each started at src[0]
// and folded in lane order, then over the tail: the same number as the Go
// loop's single running maximum (a NaN in src[0] wins everywhere, later
// NaNs lose every comparison), but in vector compares rather than one
// chain of scalar ones, which took a third of this function's time.
typedef float lanes_f32 __attribute__((vector_size(SUM_LANES * 4)));
typedef int32_t lanes_i32 __attribute__((vector_size(SUM_LANES * 4)));

static inline void softmax_row(const float *src, float *dst, long n, float *mx_out, float *sum_out) {
	lanes_f32 lm;
	for (int j = 0; j < SUM_LANES; j++) {
		lm[j] = src[0];
	}
	long full = n - n % SUM_LANES;
	for (long i = 0; i < full; i += SUM_LANES) {
		lanes_f32 v;
		memcpy(&v, src + i, sizeof v);
		lanes_i32 gt = v > lm; // all ones where src[i+j] > lm[j]
		lm = (lanes_f32)(((lanes_i32)v & gt) | ((lanes_i32)lm & ~gt));
	}
	float lane_mx[SUM_LANES];
	memcpy(lane_mx, &lm, sizeof lm);
	float mx = src[0];
	for (int j = 0; j < SUM_LANES; j++) {
		mx = lane_mx[j] > mx ? lane_mx[j] : mx;
	}
	for (long i = full; i < n; i++) {
		mx = src[i] > mx ? src[i] : mx;
	}
	float acc[SUM_LANES] = {0};
	for (long i = 0; i < full; i += SUM_LANES) {
		for (int j = 0; j < SUM_LANES; j++) {
			float d = src[i + j] - mx;
			float e = d >= -87.33654f ? exp_core(d) : 0.0f;
			dst[i + j] = e;
			acc[j] += e;
		}
	}
	for (long i = full; i < n; i++) {
		float d = src[i] - mx;
		float e = d >= -87.33654f ? exp_core(d) : 0.0f;
		dst[i] = e;
		acc[i - full] += e;
	}
	float sum = reduce_lanes(acc);
	float inv = 1.0f / sum;
	for (long i = 0; i < n; i++) {
		dst[i] *= inv;
	}
	if (mx_out) *mx_out = mx;
	if (sum_out) *sum_out = sum;
}

CLONES void tacc_softmax_rows(const float *src, float *dst, long rows, long n, float *maxs, float *sums) {
	for (long r = 0; r < rows; r++) {
		softmax_row(src + r * n, dst + r * n, n, maxs ? maxs + r : 0, sums ? sums + r : 0);
	}
}

// tacc_softmax_prefix matches softmaxPrefix32Go in fastpath.go.
CLONES void tacc_softmax_prefix(float *att, long ld, long width, long rows, const int64_t *lens, float *maxs,
				float *sums) {
	for (long r = 0; r < rows; r++) {
		float *row = att + r * ld;
		long n = (long)lens[r];
		if (n > 0) {
			softmax_row(row, row, n, maxs + r, sums + r);
		} else {
			maxs[r] = -INFINITY;
			sums[r] = 0.0f;
		}
		memset(row + n, 0, (size_t)(width - n) * sizeof(float));
	}
}

// tacc_layernorm_fwd matches layerNormFwdGo in layernorm.go.
CLONES void tacc_layernorm_fwd(const float *restrict x, const float *restrict w, const float *restrict b,
			       float *restrict y, float *restrict mean, float *restrict rstd, long rows, long cols,
			       float eps) {
	long full = cols - cols % SUM_LANES;
	for (long r = 0; r < rows; r++) {
		const float *xr = x + r * cols;
		float *yr = y + r * cols;
		float acc[SUM_LANES] = {0};
		for (long i = 0; i < full; i += SUM_LANES) {
			for (int j = 0; j < SUM_LANES; j++) {
				acc[j] += xr[i + j];
			}
		}
		for (long i = full; i < cols; i++) {
			acc[i - full] += xr[i];
		}
		float m = reduce_lanes(acc) / (float)cols;
		float acc2[SUM_LANES] = {0};
		for (long i = 0; i < full; i += SUM_LANES) {
			for (int j = 0; j < SUM_LANES; j++) {
				float d = xr[i + j] - m;
				acc2[j] += d * d;
			}
		}
		for (long i = full; i < cols; i++) {
			float d = xr[i] - m;
			acc2[i - full] += d * d;
		}
		float rs = (float)(1.0 / sqrt((double)(reduce_lanes(acc2) / (float)cols + eps)));
		for (long i = 0; i < cols; i++) {
			yr[i] = (xr[i] - m) * rs * w[i] + b[i];
		}
		mean[r] = m;
		rstd[r] = rs;
	}
}

// layernorm_bwd matches layerNormBwdGo in layernorm.go: set stores
// 0 + each row's dx term (a zeroed dx in one pass) where it is 0 adds it.
static inline void layernorm_bwd(const float *restrict dy, const float *restrict x, const float *restrict w,
				 const float *restrict mean, const float *restrict rstd, float *restrict dx,
				 float *restrict pw, float *restrict pb, long rows, long cols, int set) {
	long full = cols - cols % SUM_LANES;
	for (long r = 0; r < rows; r++) {
		const float *restrict dyr = dy + r * cols;
		const float *restrict xr = x + r * cols;
		float *restrict dxr = dx + r * cols;
		float m = mean[r], rs = rstd[r];
		float ga[SUM_LANES] = {0}, gxa[SUM_LANES] = {0};
		for (long i = 0; i < full; i += SUM_LANES) {
			for (int j = 0; j < SUM_LANES; j++) {
				float g = dyr[i + j] * w[i + j];
				ga[j] += g;
				gxa[j] += g * ((xr[i + j] - m) * rs);
			}
		}
		for (long i = full; i < cols; i++) {
			float g = dyr[i] * w[i];
			ga[i - full] += g;
			gxa[i - full] += g * ((xr[i] - m) * rs);
		}
		float g_mean = reduce_lanes(ga) / (float)cols;
		float gx_mean = reduce_lanes(gxa) / (float)cols;
		for (long i = 0; i < cols; i++) {
			float xh = (xr[i] - m) * rs;
			float d = dyr[i];
			float t = (d * w[i] - g_mean - xh * gx_mean) * rs;
			dxr[i] = (set ? 0.0f : dxr[i]) + t;
			pw[i] += d * xh;
			pb[i] += d;
		}
	}
}

// tacc_layernorm_bwd matches layerNormBwdGo in layernorm.go.
CLONES void tacc_layernorm_bwd(const float *restrict dy, const float *restrict x, const float *restrict w,
			       const float *restrict mean, const float *restrict rstd, float *restrict dx,
			       float *restrict pw, float *restrict pb, long rows, long cols) {
	layernorm_bwd(dy, x, w, mean, rstd, dx, pw, pb, rows, cols, 0);
}

// tacc_col_sums matches colSumsGo in vec.go.
CLONES void tacc_col_sums(const float *restrict dy, float *restrict p, long rows, long cols) {
	for (long r = 0; r < rows; r++) {
		const float *restrict row = dy + r * cols;
		for (long i = 0; i < cols; i++) {
			p[i] += row[i];
		}
	}
}

// tacc_add matches addGo in vec.go: z may alias x or y.
CLONES void tacc_add(const float *x, const float *y, float *z, long n) {
	for (long i = 0; i < n; i++) {
		z[i] = x[i] + y[i];
	}
}

// tacc_axpy matches axpyGo in vec.go: a*x[i] rounded, then added.
CLONES void tacc_axpy(float a, const float *restrict x, float *restrict y, long n) {
	for (long i = 0; i < n; i++) {
		y[i] += a * x[i];
	}
}

// tacc_add_bias matches addBiasGo in vec.go.
CLONES void tacc_add_bias(float *restrict y, const float *restrict b, long rows, long cols) {
	for (long r = 0; r < rows; r++) {
		float *restrict row = y + r * cols;
		for (long i = 0; i < cols; i++) {
			row[i] += b[i];
		}
	}
}

// bf16_bits matches BF16FromF32 in half.go (round to nearest even, NaN kept
// quiet), written without branches so the loops below vectorise.
static inline uint32_t bf16_bits(uint32_t u) {
	uint32_t r = (u + 0x7fffu + ((u >> 16) & 1)) >> 16;
	uint32_t nan = (u >> 16) | 0x40;
	return (u & 0x7fffffffu) > 0x7f800000u ? nan : r;
}

// tacc_bf16_from_f32 matches BF16FromF32s: src holds float32 bit patterns.
CLONES void tacc_bf16_from_f32(const uint32_t *src, uint16_t *dst, long n) {
	for (long i = 0; i < n; i++) {
		dst[i] = (uint16_t)bf16_bits(src[i]);
	}
}

// tacc_bf16_to_f32 matches BF16ToF32s: dst receives float32 bit patterns.
CLONES void tacc_bf16_to_f32(const uint16_t *src, uint32_t *dst, long n) {
	for (long i = 0; i < n; i++) {
		dst[i] = (uint32_t)src[i] << 16;
	}
}

// tacc_round_bf16 matches RoundBF16 on float32 bit patterns, in place.
CLONES void tacc_round_bf16(uint32_t *x, long n) {
	for (long i = 0; i < n; i++) {
		x[i] = bf16_bits(x[i]) << 16;
	}
}

// tacc_lse_backward matches lseBackwardGo in attention_pos.go on float32.
CLONES void tacc_lse_backward(const float *restrict p, float *restrict dp, long n, float delta) {
	for (long i = 0; i < n; i++) {
		dp[i] = p[i] * (dp[i] - delta);
	}
}

// tacc_exp_minus matches expMinus in attention_pos.go on float32.
CLONES void tacc_exp_minus(float *row, long n, float lse) {
	for (long i = 0; i < n; i++) {
		float y = row[i] - lse;
		row[i] = y >= -87.33654f ? exp_core(y < 88.72283f ? y : 88.72283f) : 0.0f;
	}
}

// adamw_step is one element of the float32 loop of AdamW in vec.go: the
// gradient multiplied by gscale, m and v formed with float64 fused
// multiply-adds rounded once to float32, and the square root of float64(v)
// rounded to float32, which is sqrtf(v).
static inline void adamw_step(float *p, const float *g, float *m, float *v, float gscale, float decay, float b1,
			      float b2, float ob1, float ob2, float step, float bc2_sqrt, float eps) {
	float gi = *g * gscale;
	float pi = *p * decay;
	float mi = (float)__builtin_fma((double)gi, (double)ob1, (double)(b1 * *m));
	float vi = (float)__builtin_fma((double)(ob2 * gi), (double)gi, (double)(b2 * *v));
	*m = mi;
	*v = vi;
	*p = pi - step * mi / (__builtin_sqrtf(vi) / bc2_sqrt + eps);
}

// fma_f32 is (float)fma(a, b, c) on 16 float32 lanes, in float64.
__attribute__((target("avx512f")))
static inline __m512 fma_f32(__m512 a, __m512 b, __m512 c) {
	__m256 lo = _mm512_cvtpd_ps(_mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(a)),
						    _mm512_cvtps_pd(_mm512_castps512_ps256(b)),
						    _mm512_cvtps_pd(_mm512_castps512_ps256(c))));
#define HI(x) _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))
	__m256 hi = _mm512_cvtpd_ps(_mm512_fmadd_pd(_mm512_cvtps_pd(HI(a)), _mm512_cvtps_pd(HI(b)), _mm512_cvtps_pd(HI(c))));
#undef HI
	return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
}

// adamw_avx512 is adamw_step on 16 lanes at a time: the same operations in
// the same order.
__attribute__((target("avx512f")))
static void adamw_avx512(float *p, const float *g, float *m, float *v, long n, float gscale, float decay, float b1,
			 float b2, float ob1, float ob2, float step, float bc2_sqrt, float eps) {
	long i = 0;
	for (; i + 16 <= n; i += 16) {
		__m512 gi = _mm512_mul_ps(_mm512_loadu_ps(g + i), _mm512_set1_ps(gscale));
		__m512 pi = _mm512_mul_ps(_mm512_loadu_ps(p + i), _mm512_set1_ps(decay));
		__m512 mi = fma_f32(gi, _mm512_set1_ps(ob1), _mm512_mul_ps(_mm512_set1_ps(b1), _mm512_loadu_ps(m + i)));
		__m512 vi = fma_f32(_mm512_mul_ps(_mm512_set1_ps(ob2), gi), gi,
				    _mm512_mul_ps(_mm512_set1_ps(b2), _mm512_loadu_ps(v + i)));
		_mm512_storeu_ps(m + i, mi);
		_mm512_storeu_ps(v + i, vi);
		__m512 den = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), _mm512_set1_ps(bc2_sqrt)), _mm512_set1_ps(eps));
		_mm512_storeu_ps(p + i, _mm512_sub_ps(pi, _mm512_div_ps(_mm512_mul_ps(_mm512_set1_ps(step), mi), den)));
	}
	for (; i < n; i++) {
		adamw_step(p + i, g + i, m + i, v + i, gscale, decay, b1, b2, ob1, ob2, step, bc2_sqrt, eps);
	}
}

// tacc_adamw matches the float32 loop of AdamW in vec.go.
void tacc_adamw(float *p, const float *g, float *m, float *v, long n, float gscale, float decay, float b1, float b2,
		float ob1, float ob2, float step, float bc2_sqrt, float eps) {
	if (__builtin_cpu_supports("avx512f")) {
		adamw_avx512(p, g, m, v, n, gscale, decay, b1, b2, ob1, ob2, step, bc2_sqrt, eps);
		return;
	}
	for (long i = 0; i < n; i++) {
		adamw_step(p + i, g + i, m + i, v + i, gscale, decay, b1, b2, ob1, ob2, step, bc2_sqrt, eps);
	}
}

// tacc_gelu_bwd_set is tacc_gelu_bwd into a zeroed dx, in one pass: it
// stores 0 + the term (0 + -0 is +0, as the addition into a cleared dx
// gives; without -ffast-math the compiler keeps the addition).
CLONES void tacc_gelu_bwd_set(const float *restrict x, const float *restrict dy, float *restrict dx, long n) {
	for (long i = 0; i < n; i++) {
		dx[i] = 0.0f + gelu_bwd_term(x[i], dy[i]);
	}
}

// tacc_gelu_bwd_bf16_set is tacc_gelu_bwd_bf16 into a zeroed dx, in one
// pass, as tacc_gelu_bwd_set.
CLONES void tacc_gelu_bwd_bf16_set(const uint16_t *restrict x, const float *restrict dy, float *restrict dx, long n) {
	for (long i = 0; i < n; i++) {
		uint32_t u = (uint32_t)x[i] << 16;
		float v;
		memcpy(&v, &u, 4);
		dx[i] = 0.0f + gelu_bwd_term(v, dy[i]);
	}
}

// tacc_layernorm_bwd_set is tacc_layernorm_bwd into a zeroed dx, in one
// pass (layerNormBwdGo with set).
CLONES void tacc_layernorm_bwd_set(const float *restrict dy, const float *restrict x, const float *restrict w,
				   const float *restrict mean, const float *restrict rstd, float *restrict dx,
				   float *restrict pw, float *restrict pb, long rows, long cols) {
	layernorm_bwd(dy, x, w, mean, rstd, dx, pw, pb, rows, cols, 1);
}

// bf16_bits_avx512 is bf16_bits on 16 lanes.
__attribute__((target("avx512f")))
static inline __m512i bf16_bits_avx512(__m512i u) {
	__m512i r = _mm512_srli_epi32(
		_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
				 _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))),
		16);
	__m512i nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
	__mmask16 is_nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
						   _mm512_set1_epi32(0x7f800000));
	return _mm512_mask_blend_epi32(is_nan, r, nan);
}

// bf16_stream_avx512 is tacc_bf16_from_f32 writing whole 64-byte lines of
// dst with non-temporal stores.
__attribute__((target("avx512f")))
static void bf16_stream_avx512(const uint32_t *src, uint16_t *dst, long n) {
	long i = 0;
	for (; i < n && ((uintptr_t)(dst + i) & 63) != 0; i++) {
		dst[i] = (uint16_t)bf16_bits(src[i]);
	}
	for (; i + 32 <= n; i += 32) {
		__m256i lo = _mm512_cvtepi32_epi16(bf16_bits_avx512(_mm512_loadu_si512(src + i)));
		__m256i hi = _mm512_cvtepi32_epi16(bf16_bits_avx512(_mm512_loadu_si512(src + i + 16)));
		_mm512_stream_si512((__m512i *)(dst + i), _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
	}
	for (; i < n; i++) {
		dst[i] = (uint16_t)bf16_bits(src[i]);
	}
	_mm_sfence();
}

// tacc_bf16_from_f32_stream is tacc_bf16_from_f32 for a copy nothing reads
// soon (an activation's, read in the backward): on AVX-512 its lines are
// written past the caches, not read in from memory first.
void tacc_bf16_from_f32_stream(const uint32_t *src, uint16_t *dst, long n) {
	if (__builtin_cpu_supports("avx512f")) {
		bf16_stream_avx512(src, dst, n);
		return;
	}
	tacc_bf16_from_f32(src, dst, n);
}

// go_log matches math.Log on amd64 (archLog, log_amd64.s) operation for
// operation, for every input a float32 widens to: the same reduction to
// f1 in [sqrt(2)/2, sqrt(2)) by the exponent bits (no rescaling of
// subnormals, which no widened float32 is), the same polynomial and the
// same order of the final sums. Written without branches so the loop of
// tacc_lse_rows vectorises, the special cases chosen at the end as there.
static inline double go_log(double x) {
	uint64_t bx;
	memcpy(&bx, &x, 8);
	uint64_t fb = (bx & 0x000FFFFFFFFFFFFFull) | 0x3FE0000000000000ull;
	double f1;
	memcpy(&f1, &fb, 8);
	double k = (double)((int32_t)((bx >> 52) & 0x7FF) - 0x3FE);
	// if !(sqrt(2)/2 < f1) { k -= 1; f1 *= 2 }, the asm's compare, on the
	// bits: f1 and sqrt(2)/2 (0x3FE6A09E667F3BCD) are positive and finite
	double low = (double)(fb <= 0x3FE6A09E667F3BCDull);
	k = k - low;
	f1 = f1 * (low + 1.0);
	double f = f1 - 1.0;
	double s = f / (2.0 + f);
	double s2 = s * s;
	double s4 = s2 * s2;
	double t1 = s2 * (((1.479819860511658591e-01 * s4 + 1.818357216161805012e-01) * s4 + 2.857142874366239149e-01) * s4 +
			  6.666666666666735130e-01);
	double t2 = s4 * ((1.531383769920937332e-01 * s4 + 2.222219843214978396e-01) * s4 + 3.999999999940941908e-01);
	double r = t1 + t2;
	double hfsq = 0.5 * f * f;
	double lo = s * (hfsq + r) + k * 1.90821492927058770002e-10;
	double y = k * 6.93147180369123816490e-01 - ((hfsq - lo) - f);
	uint64_t yb;
	memcpy(&yb, &y, 8);
	uint64_t big = -(uint64_t)((int64_t)bx >= (int64_t)0x7FF0000000000000ull); // +Inf or NaN: x
	uint64_t neg = -(uint64_t)((int64_t)bx < 0);                                 // below zero: NaN
	uint64_t zero = -(uint64_t)((bx & 0x7FFFFFFFFFFFFFFFull) == 0);              // ±0: -Inf
	yb = (yb & ~big) | (bx & big);
	yb = (yb & ~neg) | (0x7FF8000000000001ull & neg);
	yb = (yb & ~zero) | (0xFFF0000000000000ull & zero);
	memcpy(&y, &yb, 8);
	return y;
}

// tacc_lse_rows matches lseRowsGo in attention_pos.go on float32: each
// row's log-sum-exp from its maximum and its sum of exponentials.
CLONES void tacc_lse_rows(float *lse, const float *maxs, const float *sums, long n) {
	for (long i = 0; i < n; i++) {
		lse[i] = maxs[i] + (float)go_log((double)sums[i]);
	}
}

// attn_delta_sums sums dout·out in float64 in index order (AttentionDelta's
// loop) for M (row, head) pairs from pair u0 on, pair u being head u % nh
// of row u / nh: M independent chains of additions side by side, where
// one pair at a time waits on each addition before the next, over
// neighbouring stretches of the same rows.
#define ATTN_DELTA_CHAINS 8
static inline void attn_delta_sums(const float *dout, const float *out, float *delta, long u0, long m, long tq, long nh,
				   long hs, long ldo) {
	const float *g[ATTN_DELTA_CHAINS], *o[ATTN_DELTA_CHAINS];
	for (long j = 0; j < m; j++) {
		long r = (u0 + j) / nh, h = (u0 + j) % nh;
		g[j] = dout + r * ldo + h * hs;
		o[j] = out + r * ldo + h * hs;
	}
	double s[ATTN_DELTA_CHAINS] = {0};
	for (long i = 0; i < hs; i++) {
		for (long j = 0; j < m; j++) {
			s[j] += (double)g[j][i] * (double)o[j][i];
		}
	}
	for (long j = 0; j < m; j++) {
		long r = (u0 + j) / nh, h = (u0 + j) % nh;
		delta[(r / tq * nh + h) * tq + r % tq] = (float)s[j];
	}
}

// tacc_attn_delta matches attentionDeltaGo in attention_merge.go on
// float32 for rows [lo, hi) of the B*tq rows of dout and out.
CLONES void tacc_attn_delta(const float *dout, const float *out, float *delta, long lo, long hi, long tq, long nh,
			    long hs, long ldo) {
	long u = lo * nh, end = hi * nh;
	for (; u + ATTN_DELTA_CHAINS <= end; u += ATTN_DELTA_CHAINS) {
		attn_delta_sums(dout, out, delta, u, ATTN_DELTA_CHAINS, tq, nh, hs, ldo);
	}
	for (; u < end; u++) {
		attn_delta_sums(dout, out, delta, u, 1, tq, nh, hs, ldo);
	}
}

// tacc_exp_minus_rows is expMinusRowsGo in attention_pos.go on float32: for
// each of rows rows of stride ld, tacc_exp_minus on its first lens[r]
// entries with lse[r] and zeros up to ends[r], one call for a row block.
CLONES void tacc_exp_minus_rows(float *p, long ld, long rows, const int64_t *lens, const int64_t *ends, const float *lse) {
	for (long r = 0; r < rows; r++) {
		float *row = p + r * ld;
		tacc_exp_minus(row, (long)lens[r], lse[r]);
		memset(row + lens[r], 0, (size_t)(ends[r] - lens[r]) * sizeof(float));
	}
}

// tacc_lse_backward_rows is lseBackwardRowsGo in attention_pos.go on
// float32: tacc_lse_backward on the first lens[r] entries of row r of p
// and dp (stride ld) with delta[r], and zeros in dp up to ends[r].
CLONES void tacc_lse_backward_rows(const float *p, float *dp, long ld, long rows, const int64_t *lens,
				   const int64_t *ends, const float *delta) {
	for (long r = 0; r < rows; r++) {
		tacc_lse_backward(p + r * ld, dp + r * ld, (long)lens[r], delta[r]);
		memset(dp + r * ld + lens[r], 0, (size_t)(ends[r] - lens[r]) * sizeof(float));
	}
}

// silu_exp matches siluExp in silu.go: e^-g, the exponent clamped as
// gelu_exp's.
static inline float silu_exp(float g) {
	float z = -g;
	z = z < -87.33654f ? -87.33654f : (z > 80.0f ? 80.0f : z);
	return exp_core(z);
}

// tacc_silu_mul_fwd matches siluMulFwd32Go: rows of [gate | up] (stride
// 2*n) to rows of silu(gate)*up (stride n).
CLONES void tacc_silu_mul_fwd(const float *restrict x, float *restrict y, long rows, long n) {
	for (long r = 0; r < rows; r++) {
		const float *g = x + r * 2 * n, *u = g + n;
		float *o = y + r * n;
		for (long i = 0; i < n; i++) {
			float a = g[i];
			o[i] = a / (1.0f + silu_exp(a)) * u[i];
		}
	}
}

// tacc_silu_mul_bwd matches siluMulBwd32Go: sets dx (the layout of x) to
// the gradient of tacc_silu_mul_fwd's output given dy.
CLONES void tacc_silu_mul_bwd(const float *restrict x, const float *restrict dy, float *restrict dx, long rows, long n) {
	for (long r = 0; r < rows; r++) {
		const float *g = x + r * 2 * n, *u = g + n, *d = dy + r * n;
		float *dg = dx + r * 2 * n, *du = dg + n;
		for (long i = 0; i < n; i++) {
			float a = g[i], b = u[i], e = d[i];
			float s = 1.0f / (1.0f + silu_exp(a));
			dg[i] = e * b * s * (1.0f + a * (1.0f - s));
			du[i] = e * a * s;
		}
	}
}

// tacc_rmsnorm_fwd matches rmsNormFwd32Go in rmsnorm.go.
CLONES void tacc_rmsnorm_fwd(const float *restrict x, const float *restrict w, float *restrict y, float *restrict rstd,
			     long rows, long cols, float eps) {
	long full = cols - cols % SUM_LANES;
	for (long r = 0; r < rows; r++) {
		const float *xr = x + r * cols;
		float *yr = y + r * cols;
		float acc[SUM_LANES] = {0};
		for (long i = 0; i < full; i += SUM_LANES) {
			for (int j = 0; j < SUM_LANES; j++) {
				float v = xr[i + j];
				acc[j] += v * v;
			}
		}
		for (long i = full; i < cols; i++) {
			float v = xr[i];
			acc[i - full] += v * v;
		}
		float rs = (float)(1.0 / sqrt((double)(reduce_lanes(acc) / (float)cols + eps)));
		for (long i = 0; i < cols; i++) {
			yr[i] = xr[i] * rs * w[i];
		}
		rstd[r] = rs;
	}
}

// tacc_rmsnorm_bwd matches rmsNormBwd32Go in rmsnorm.go.
CLONES void tacc_rmsnorm_bwd(const float *restrict dy, const float *restrict x, const float *restrict w,
			     const float *restrict rstd, float *restrict dx, float *restrict pw, long rows, long cols) {
	long full = cols - cols % SUM_LANES;
	for (long r = 0; r < rows; r++) {
		const float *dys = dy + r * cols, *xs = x + r * cols;
		float *dxs = dx + r * cols;
		float s = rstd[r];
		float acc[SUM_LANES] = {0};
		for (long i = 0; i < full; i += SUM_LANES) {
			for (int j = 0; j < SUM_LANES; j++) {
				acc[j] += dys[i + j] * w[i + j] * (xs[i + j] * s);
			}
		}
		for (long i = full; i < cols; i++) {
			acc[i - full] += dys[i] * w[i] * (xs[i] * s);
		}
		float m = reduce_lanes(acc) / (float)cols;
		for (long c = 0; c < cols; c++) {
			float xh = xs[c] * s;
			dxs[c] += s * (dys[c] * w[c] - xh * m);
			pw[c] += dys[c] * xh;
		}
	}
}

// tacc_rope_rotate matches ropeRotateGo in rope.go on float32: rows [lo, hi).
CLONES void tacc_rope_rotate(const float *restrict x, float *restrict y, long lo, long hi, long T, long ld, long col, long n,
			     long h, const double *restrict cs, const double *restrict sn, double sign) {
	for (long r = lo; r < hi; r++) {
		const double *c = cs + (r % T) * h, *s = sn + (r % T) * h;
		for (long o = col; o < col + n; o += 2 * h) {
			const float *xa = x + r * ld + o, *xb = xa + h;
			float *ya = y + r * ld + o, *yb = ya + h;
			for (long d = 0; d < h; d++) {
				double a = xa[d], b = xb[d], t = sign * s[d];
				ya[d] = (float)(a * c[d] - b * t);
				yb[d] = (float)(b * c[d] + a * t);
			}
		}
	}
}

