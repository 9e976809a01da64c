//go:build cgo && !purego

// A bf16 matrix product with float32 accumulation on the AVX512-BF16
// instruction VDPBF16PS, which multiplies pairs of bf16 numbers and adds both
// products to a float32 lane. The operands are packed so that each 32-bit
// lane holds two neighbours along k: B into panels of TACC_BF16_NR columns,
// A into tiles of TACC_BF16_MR rows, and a 12x32 tile of C is kept in 24
// vector registers while k runs. Inputs stored as float32 are rounded to
// bf16 (to nearest, ties to even, as bf16FromF32 in half.go) while packing,
// so such a product equals the product of the converted matrices.
//
// The function is compiled for the instruction set with a target attribute
// and only called when tacc_bf16_supported says the CPU has it.

#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include "gemm_bf16.h"

#define NR TACC_BF16_NR
#define MR TACC_BF16_MR
#define KC TACC_BF16_KC
#define MC TACC_BF16_MC
#define KS TACC_BF16_KS
#define PF 4 // rows pack_a prefetches ahead

int tacc_bf16_supported(void) {
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

// round_bf16 matches bf16FromF32 in half.go: round to nearest even, NaN kept quiet.
static inline uint16_t round_bf16(float f) {
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u) {
		return (uint16_t)((u >> 16) | 0x40);
	}
	u += 0x7fffu + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

// elem reads op(X)[r][c] of a matrix stored row-major with stride ld, as bf16.
static inline uint16_t elem(const void *x, int f32, int trans, long ld, long r, long c) {
	long off = trans ? c * ld + r : r * ld + c;
	return f32 ? round_bf16(((const float *)x)[off]) : ((const uint16_t *)x)[off];
}

// round16 is round_bf16 on 16 float32 bit patterns: the bf16 in the low
// half of each 32-bit lane, the high half zero.
__attribute__((target("avx512f")))
static inline __m512i round16(__m512i u) {
	__m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
	__m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
	__m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
	__mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
	__m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
	return _mm512_mask_mov_epi32(r, nan, quiet);
}

// pairs16 returns the 16 pairs (32-bit lanes) q0..q0+15 of row j of a
// stored matrix: as stored for bf16, or its 32 float32 numbers rounded
// (round16) and the low halves gathered in order, as pack_row_vec does.
__attribute__((target("avx512f,avx512bw")))
static inline __m512i pairs16(const void *b, int b_f32, long ldb, long j, long q0) {
	if (!b_f32) {
		return _mm512_loadu_si512((const uint16_t *)b + j * ldb + 2 * q0);
	}
	// vpermt2w indices of the low 16 bits of the 32 lanes of two vectors
	const __m512i four = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60);
	const __m512i evens = _mm512_or_si512(four, _mm512_slli_epi32(_mm512_add_epi32(four, _mm512_set1_epi32(2)), 16));
	const float *f = (const float *)b + j * ldb + 2 * q0;
	return _mm512_permutex2var_epi16(round16(_mm512_loadu_si512(f)), evens, round16(_mm512_loadu_si512(f + 16)));
}

// transpose16 writes the 16x16 block of 32-bit pairs at rows
// j0..j0+15, pairs q0..q0+15 of a stored matrix (pair q of row j: its
// numbers 2q and 2q+1, bf16 or rounded from float32 by pairs16) transposed:
// pair q0+c of rows j0.. to out + c*NR. Four rounds of shuffles: the pairs
// of two rows interleaved, then of four (a 128-bit lane holds one pair of
// four rows), then the lanes gathered.
__attribute__((target("avx512f,avx512bw")))
static void transpose16(const void *b, int b_f32, long ldb, long j0, long q0, uint32_t *out) {
	__m512i r[16], t[16], u[16];
	for (int i = 0; i < 16; i++) {
		r[i] = pairs16(b, b_f32, ldb, j0 + i, q0);
	}
	for (int i = 0; i < 16; i += 2) {
		t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
		t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
	}
	// u[4g+c], 128-bit lane L: pair 4L+c of rows 4g..4g+3
	for (int g = 0; g < 16; g += 4) {
		u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
		u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
		u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
		u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
	}
	for (int c = 0; c < 4; c++) {
		__m512i x0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), x1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xee);
		__m512i y0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44), y1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xee);
		_mm512_storeu_si512(out + c * NR, _mm512_shuffle_i32x4(x0, y0, 0x88));
		_mm512_storeu_si512(out + (4 + c) * NR, _mm512_shuffle_i32x4(x0, y0, 0xdd));
		_mm512_storeu_si512(out + (8 + c) * NR, _mm512_shuffle_i32x4(x1, y1, 0x88));
		_mm512_storeu_si512(out + (12 + c) * NR, _mm512_shuffle_i32x4(x1, y1, 0xdd));
	}
}

// pack_pairs_vec packs the first pairs full pairs of panel columns
// j0..j0+NR (all below n) 16 columns at a time: the same lanes as the scalar
// loop of tacc_bf16_pack_b, each a 32-bit (B[2q][j], B[2q+1][j]). Not
// transposed, the two rows are contiguous runs; transposed (B[j][2q] and
// B[j][2q+1] side by side in row j of the stored matrix), each lane is
// gathered from its row. gather says the stored offsets fit the gather's
// 32-bit indices.
__attribute__((target("avx512f,avx512bw")))
static void pack_pairs_vec(const void *b, int b_f32, int trans, long ldb, long j0, long pairs, uint32_t *out) {
	const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
	long q = 0;
	if (trans) {
		// a stored bf16 pair is already a lane, and 32 float32 numbers
		// of a row round to 16 of them: 16x16 blocks of lanes are
		// transposed in registers, without the gathers below
		for (; q + 16 <= pairs; q += 16) {
			for (long h = 0; h < NR; h += 16) {
				transpose16(b, b_f32, ldb, j0 + h, q, out + q * NR + h);
			}
		}
	}
	for (; q < pairs; q++) {
		for (long h = 0; h < NR; h += 16) {
			__m512i lo, hi, v;
			if (!trans) {
				long o0 = 2 * q * ldb + j0 + h, o1 = o0 + ldb;
				if (b_f32) {
					lo = round16(_mm512_loadu_si512((const float *)b + o0));
					hi = round16(_mm512_loadu_si512((const float *)b + o1));
				} else {
					lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)b + o0)));
					hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)b + o1)));
				}
				v = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
			} else {
				// element offsets (j0+h+lane)*ldb + 2q
				__m512i idx = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_add_epi32(lanes, _mm512_set1_epi32((int)(j0 + h))),
										 _mm512_set1_epi32((int)ldb)),
							       _mm512_set1_epi32((int)(2 * q)));
				if (b_f32) {
					lo = round16(_mm512_i32gather_epi32(idx, b, 4));
					hi = round16(_mm512_i32gather_epi32(_mm512_add_epi32(idx, _mm512_set1_epi32(1)), b, 4));
					v = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
				} else {
					v = _mm512_i32gather_epi32(_mm512_add_epi32(idx, idx), b, 1); // both halves, little-endian
				}
			}
			_mm512_storeu_si512(out + q * NR + h, v);
		}
	}
}

// tacc_bf16_pack_b packs panels [p0, p1) of op(B) (k x n): panel p holds
// columns p*NR.. as (k+1)/2 pairs, each pair NR lanes of (B[2q][j], B[2q+1][j]),
// zero past k and n. Full panels' full pairs take the vector path.
void tacc_bf16_pack_b(const void *b, int b_f32, int trans, long k, long n, long ldb, uint16_t *dst, long p0, long p1) {
	long kp = (k + 1) / 2;
	// the transposed path's gather indices: elements (f32) or bytes (bf16)
	// below 2^31
	int gather = (n * ldb + k) * (b_f32 ? 1 : 2) < 0x7fffffffL;
	for (long p = p0; p < p1; p++) {
		uint16_t *out = dst + p * kp * 2 * NR;
		long j0 = p * NR;
		long q = 0;
		if (j0 + NR <= n && (!trans || gather)) {
			pack_pairs_vec(b, b_f32, trans, ldb, j0, k / 2, (uint32_t *)out);
			q = k / 2;
		}
		for (; q < kp; q++) {
			for (long j = 0; j < NR; j++) {
				long col = j0 + j;
				uint16_t lo = 0, hi = 0;
				if (col < n) {
					lo = elem(b, b_f32, trans, ldb, 2 * q, col);
					if (2 * q + 1 < k) {
						hi = elem(b, b_f32, trans, ldb, 2 * q + 1, col);
					}
				}
				out[(q * NR + j) * 2] = lo;
				out[(q * NR + j) * 2 + 1] = hi;
			}
		}
	}
}

// pack_tile_vec packs the full pairs [q0, q0+pairs) of the rows rows
// (1..MR) from row0 of op(A) transposed (the rows of op(A) contiguous in
// the stored rows kk and kk+1), zero in the tile's lanes past them: the
// lanes of pack_a's loop, MR at a time under masks.
__attribute__((target("avx512f,avx512bw,avx512vl")))
static void pack_tile_vec(const void *a, int a_f32, long lda, long row0, long rows, long q0, long pairs, uint32_t *dst) {
	const __mmask16 mr = (__mmask16)((1u << MR) - 1), in = (__mmask16)((1u << rows) - 1);
	for (long q = 0; q < pairs; q++) {
		long kk = 2 * (q0 + q);
		long o0 = kk * lda + row0, o1 = o0 + lda;
		__m512i lo, hi;
		if (a_f32) {
			// round16 of a zero lane is zero
			lo = round16(_mm512_maskz_loadu_epi32(in, (const float *)a + o0));
			hi = round16(_mm512_maskz_loadu_epi32(in, (const float *)a + o1));
		} else {
			lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(in, (const uint16_t *)a + o0));
			hi = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(in, (const uint16_t *)a + o1));
		}
		_mm512_mask_storeu_epi32(dst + q * MR, mr, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
	}
}

// pack_row_vec packs pairs [q0, q0+kc) of row row of op(A) not transposed,
// where the row's k numbers are contiguous: bf16 neighbours along k are
// already a pair, so the row is rounded (or copied) 32 numbers at a time
// into kc consecutive lanes, zero past k.
__attribute__((target("avx512f,avx512bw,avx512vl")))
static void pack_row_vec(const void *a, int a_f32, long lda, long k, long row, long q0, long kc, uint32_t *dst) {
	// vpermt2w indices of the low 16 bits of the 32 lanes of two vectors
	// (lane j of the epi32 view: word 4j in the low half, 4j+2 in the high)
	const __m512i four = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60);
	const __m512i evens = _mm512_or_si512(four, _mm512_slli_epi32(_mm512_add_epi32(four, _mm512_set1_epi32(2)), 16));
	long k0 = 2 * q0, n = k - k0; // numbers of the row from k0
	n = n < 2 * kc ? n : 2 * kc;
	const float *f = (const float *)a + row * lda + k0;
	const uint16_t *h = (const uint16_t *)a + row * lda + k0;
	for (long i = 0; i < 2 * kc; i += 32) {
		long left = n - i;
		__mmask32 m = left >= 32 ? 0xffffffffu : (left <= 0 ? 0 : (__mmask32)((1ull << left) - 1));
		__m512i v;
		if (a_f32) {
			__m512i lo = round16(_mm512_maskz_loadu_epi32((__mmask16)m, f + i));
			__m512i hi = round16(_mm512_maskz_loadu_epi32((__mmask16)(m >> 16), f + i + 16));
			v = _mm512_permutex2var_epi16(lo, evens, hi);
		} else {
			v = _mm512_maskz_loadu_epi16(m, h + i);
		}
		long lanes = 2 * kc - i < 32 ? (2 * kc - i) / 2 : 16;
		_mm512_mask_storeu_epi32(dst + i / 2, (__mmask16)((1u << lanes) - 1), v);
	}
}

// pack_a packs rows [m0, m1) and pairs [q0, q0+kc) of op(A) into tiles of MR
// rows, zero past m1 and k. Transposed, tile t holds pair q of row r at
// (t*kc + q)*MR + r (pairs outer, as the stored rows run); not transposed,
// at (t*MR + r)*kc + q (each row's pairs together, as the stored rows run),
// which the kernel reads with the strides of kernel_rows.
static void pack_a(const void *a, int a_f32, int trans, long lda, long k, long m0, long m1, long q0, long kc, uint32_t *dst) {
	long tiles = (m1 - m0 + MR - 1) / MR;
	if (!trans) {
		long esz = a_f32 ? 4 : 2, bytes = 2 * kc * esz; // the numbers a row packs
		for (long r = 0; r < tiles * MR; r++) {
			if (m0 + r + PF < m1) {
				// the row PF ahead, whose start a stride away from this
				// row's end the hardware prefetcher does not foresee
				const char *next = (const char *)a + ((m0 + r + PF) * lda + 2 * q0) * esz;
				for (long o = 0; o < bytes; o += 64) {
					__builtin_prefetch(next + o, 0, 3);
				}
			}
			if (m0 + r < m1) {
				pack_row_vec(a, a_f32, lda, k, m0 + r, q0, kc, dst + r * kc);
			} else {
				memset(dst + r * kc, 0, kc * sizeof(uint32_t));
			}
		}
		return;
	}
	long full = k / 2 - q0; // full pairs from q0
	full = full < 0 ? 0 : (full < kc ? full : kc);
	for (long t = 0; t < tiles; t++) {
		long rows = m1 - m0 - t * MR < MR ? m1 - m0 - t * MR : MR;
		pack_tile_vec(a, a_f32, lda, m0 + t * MR, rows, q0, full, dst + t * kc * MR);
		long q = full;
		for (; q < kc; q++) {
			long kk = 2 * (q0 + q);
			for (long r = 0; r < MR; r++) {
				long row = m0 + t * MR + r;
				uint32_t v = 0;
				if (row < m1) {
					uint32_t lo = elem(a, a_f32, 1, lda, row, kk);
					uint32_t hi = kk + 1 < k ? elem(a, a_f32, 1, lda, row, kk + 1) : 0;
					v = lo | hi << 16;
				}
				dst[(t * kc + q) * MR + r] = v;
			}
		}
	}
}

// kernel_body adds alpha * (A tile x B panel) over kc pairs to the mr x nr
// corner of C, or with overwrite stores it there without reading C (as
// adding it to zeros would, bitwise), reading pair q of the tile's row r at
// ap[r*rs + q*qs], and with bias (NULL for none) adds bias[j] to column j
// of what it stores, a second float32 addition. It multiplies the tile's first h rows (h a constant of
// each instance: MR, or 8 or 4 for a tile's last rows, h >= mr), so a tile
// of few rows takes the time of its rows rather than of MR: each row's
// sums are the same instructions in the same order whatever h, so the
// result is too. The corner of C is prefetched first: it is touched only
// after the k loop, and a miss there would stall the whole tile.
__attribute__((target("avx512f,avx512bw,avx512bf16"), always_inline))
static inline void kernel_body(const int h, const uint32_t *ap, long rs, long qs, const uint16_t *bp, long kc, float *c,
			       long ldc, long mr, long nr, float alpha, int overwrite, const float *bias) {
	for (long r = 0; r < mr; r++) {
		__builtin_prefetch(c + r * ldc, 1, 3);
		__builtin_prefetch(c + r * ldc + NR - 1, 1, 3);
	}
	__m512 acc[2 * MR];
#pragma GCC unroll 24
	for (int i = 0; i < 2 * h; i++) {
		acc[i] = _mm512_setzero_ps();
	}
	for (long q = 0; q < kc; q++) {
		__m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + q * 2 * NR);
		__m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + q * 2 * NR + 32);
#pragma GCC unroll 12
		for (int r = 0; r < h; r++) {
			__m512bh av = (__m512bh)_mm512_set1_epi32((int)ap[r * rs + q * qs]);
			acc[2 * r] = _mm512_dpbf16_ps(acc[2 * r], av, b0);
			acc[2 * r + 1] = _mm512_dpbf16_ps(acc[2 * r + 1], av, b1);
		}
	}
	__m512 va = _mm512_set1_ps(alpha);
	__mmask16 m0 = nr >= 16 ? 0xffff : (__mmask16)((1u << nr) - 1);
	__mmask16 m1 = nr >= 32 ? 0xffff : (nr <= 16 ? 0 : (__mmask16)((1u << (nr - 16)) - 1));
	__m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
	if (bias) {
		b0 = _mm512_maskz_loadu_ps(m0, bias);
		b1 = _mm512_maskz_loadu_ps(m1, bias + 16);
	}
	for (long r = 0; r < mr; r++) {
		float *row = c + r * ldc;
		__m512 c0 = _mm512_setzero_ps(), c1 = _mm512_setzero_ps();
		if (!overwrite) {
			c0 = _mm512_maskz_loadu_ps(m0, row);
			c1 = _mm512_maskz_loadu_ps(m1, row + 16);
		}
		__m512 v0 = _mm512_add_ps(c0, _mm512_mul_ps(va, acc[2 * r]));
		__m512 v1 = _mm512_add_ps(c1, _mm512_mul_ps(va, acc[2 * r + 1]));
		if (bias) { // a second addition, as AddBias after the product
			v0 = _mm512_add_ps(v0, b0);
			v1 = _mm512_add_ps(v1, b1);
		}
		_mm512_mask_storeu_ps(row, m0, v0);
		_mm512_mask_storeu_ps(row + 16, m1, v1);
	}
}

// kernel_pairs reads a tile packed pairs outer (transposed A), kernel_rows
// one packed rows outer (A not transposed), its rows rs pairs apart; each
// runs the instance of kernel_body of the fewest rows that covers mr.
__attribute__((target("avx512f,avx512bw,avx512bf16")))
static void kernel_pairs(const uint32_t *ap, const uint16_t *bp, long kc, float *c, long ldc, long mr, long nr, float alpha,
			 int overwrite, const float *bias) {
	if (mr > 8) {
		kernel_body(MR, ap, 1, MR, bp, kc, c, ldc, mr, nr, alpha, overwrite, bias);
	} else if (mr > 4) {
		kernel_body(8, ap, 1, MR, bp, kc, c, ldc, mr, nr, alpha, overwrite, bias);
	} else {
		kernel_body(4, ap, 1, MR, bp, kc, c, ldc, mr, nr, alpha, overwrite, bias);
	}
}

__attribute__((target("avx512f,avx512bw,avx512bf16")))
static void kernel_rows(const uint32_t *ap, long rs, const uint16_t *bp, long kc, float *c, long ldc, long mr, long nr,
			float alpha, int overwrite, const float *bias) {
	if (mr > 8) {
		kernel_body(MR, ap, rs, 1, bp, kc, c, ldc, mr, nr, alpha, overwrite, bias);
	} else if (mr > 4) {
		kernel_body(8, ap, rs, 1, bp, kc, c, ldc, mr, nr, alpha, overwrite, bias);
	} else {
		kernel_body(4, ap, rs, 1, bp, kc, c, ldc, mr, nr, alpha, overwrite, bias);
	}
}

// tacc_bf16_gemm_rows adds alpha * op(A)[m0:m1] x op(B) to rows m0..m1 of C
// (with overwrite, sets them to it: C is not read, as BLAS's beta = 0),
// with op(B) packed by tacc_bf16_pack_b. m1 - m0 may be any size; rows are
// taken MC at a time, packed into scratch (MC * KC uint32). Panel p of
// op(B) starts ldp pairs after panel p-1 ((k+1)/2 for a packing of op(B)
// alone; more for k rows of a larger packing, from an even row). With bias (n
// numbers; NULL for none), bias[j] is then added to column j of each
// tile as its last sum is stored: bitwise the product followed by
// AddBias, without another pass over C.
//
// A stored bf16 and not transposed, with k and lda even and 4-byte
// aligned, already holds each row's pairs as the 32-bit lanes pack_row_vec
// would copy, lda/2 lanes apart: kernel_rows reads its full tiles where
// they are stored, and only a last tile of fewer than MR rows is packed
// (the kernel reads all the rows of its instance, which past m1 may lie
// past the matrix). The kernel sees the same lanes in the same order, so
// the result is the packed product's, bitwise.
void tacc_bf16_gemm_rows(const uint16_t *packed_b, long ldp, long k, long n, const void *a, int a_f32, int trans, long lda,
			 long m0, long m1, float alpha, float *c, long ldc, int overwrite, const float *bias,
			 uint32_t *scratch) {
	long kp = (k + 1) / 2;
	long panels = (n + NR - 1) / NR;
	uint32_t *ap = scratch;
	int in_place = !trans && !a_f32 && k % 2 == 0 && lda % 2 == 0 && ((uintptr_t)a & 3) == 0;
	const uint32_t *a32 = (const uint32_t *)a;
	for (long i0 = m0; i0 < m1; i0 += MC) {
		long i1 = i0 + MC < m1 ? i0 + MC : m1;
		long full = in_place ? (i1 - i0) / MR : 0; // tiles read where stored
		for (long q0 = 0; q0 < kp; q0 += KC) {
			long kc = q0 + KC < kp ? KC : kp - q0;
			if (i0 + full * MR < i1) {
				pack_a(a, a_f32, trans, lda, k, i0 + full * MR, i1, q0, kc, ap);
			}
			for (long p = 0; p < panels; p++) {
				const uint16_t *bp = packed_b + (p * ldp + q0) * 2 * NR;
				long nr = n - p * NR < NR ? n - p * NR : NR;
				for (long t = 0; i0 + t * MR < i1; t++) {
					long mr = i1 - i0 - t * MR < MR ? i1 - i0 - t * MR : MR;
					float *ct = c + (i0 + t * MR) * ldc + p * NR;
					// KS pairs a call, their sum added to C before the
					// next: the same additions in the same order whatever
					// KC is
					for (long s = 0; s < kc; s += KS) {
						long ks = s + KS < kc ? KS : kc - s;
						int ow = overwrite && q0 + s == 0;
						const float *bt = bias && q0 + s + ks == kp ? bias + p * NR : NULL; // the last sum
						if (trans) {
							kernel_pairs(ap + (t * kc + s) * MR, bp + s * 2 * NR, ks, ct, ldc, mr, nr, alpha, ow, bt);
						} else if (t < full) {
							if (p == 0 && t + 1 < full) {
								// the next tile's rows, read from memory on
								// the first panel, as pack_a prefetches
								const char *nx = (const char *)(a32 + (i0 + (t + 1) * MR) * (lda / 2) + q0 + s);
								for (long r = 0; r < MR; r++) {
									for (long o = 0; o < ks * 4; o += 64) {
										__builtin_prefetch(nx + r * lda * 2 + o, 0, 3);
									}
								}
							}
							kernel_rows(a32 + (i0 + t * MR) * (lda / 2) + q0 + s, lda / 2, bp + s * 2 * NR, ks, ct, ldc, mr, nr,
								    alpha, ow, bt);
						} else {
							kernel_rows(ap + (t - full) * kc * MR + s, kc, bp + s * 2 * NR, ks, ct, ldc, mr, nr, alpha, ow, bt);
						}
					}
				}
			}
		}
	}
}
