// The half-precision conversions and checks of the cgo build; see
// half_cgo.go.
#ifndef TINYACC_CPU_HALF_F16C_H
#define TINYACC_CPU_HALF_F16C_H

#include <stdint.h>

int tacc_f16c_supported(void);
void tacc_f16_from_f32(const uint32_t *src, uint16_t *dst, long n);
void tacc_f16_to_f32(const uint16_t *src, uint32_t *dst, long n);
void tacc_round_f16_2d(const uint32_t *src, uint32_t *dst, long rows, long cols, long lds, long ldd);
int tacc_f16_exact_2d(const uint32_t *src, long rows, long cols, long ld);
void tacc_round_bf16_2d(const uint32_t *src, uint32_t *dst, long rows, long cols, long lds, long ldd);
int tacc_bf16_exact_2d(const uint32_t *src, long rows, long cols, long ld);

#endif
