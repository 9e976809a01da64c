// The AVX512-BF16 matrix product of the cgo build; see gemm_bf16_cgo.go.
#ifndef TINYACC_CPU_GEMM_BF16_H
#define TINYACC_CPU_GEMM_BF16_H

#include <stdint.h>

// Width of a packed panel of B (columns) and height of a tile of A (rows).
#define TACC_BF16_NR 32
#define TACC_BF16_MR 12
// k pairs per block and rows per block of A: its packed block, the caller's
// TACC_BF16_MC x TACC_BF16_KC scratch of uint32, stays in cache (L2). 512
// pairs took about 3% less time than 128 in the products of a training
// step 768 wide (0 to 4% at 256 wide), fewer blocks of A packed and each
// tile's corner of C summed into while it is still in L1.
#define TACC_BF16_KC 512
#define TACC_BF16_MC (TACC_BF16_MR * 16)
// k pairs each sum of the kernel's accumulators takes before it is added
// to C: it fixes the order of C's float32 additions, so it stays 128
// whatever the blocking (TACC_BF16_KC is a multiple of it).
#define TACC_BF16_KS 128

int tacc_bf16_supported(void);
void tacc_bf16_pack_b(const void *b, int b_f32, int trans, long k, long n, long ldb, uint16_t *dst, long p0, long p1);
void tacc_bf16_gemm_rows(const uint16_t *packed_b, long ldp, long k, long n, const void *a, int a_f32, int trans, long lda,
			 long m0, long m1, float alpha, float *c, long ldc, int overwrite, const float *bias,
			 uint32_t *scratch);

#endif
