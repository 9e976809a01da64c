// The half-precision conversions and checks of the cgo build; see
// half_cgo.go.
#ifndef TINYACC_CPU_HALF_F16C_H
#define TINYACC_CPU_HALF_F16C_H

#include <stdint.h>

int tacc_f16c_supported(void);
void tacc_f16_from_f32(const uint32_t *src, uint16_t *dst, long n);
void tacc_f16_to_f32(const uint16_t *src, uint32_t *dst, long n);
void tacc_round_f16(const uint32_t *src, uint32_t *dst, long n);
int tacc_f16_exact(const uint32_t *src, long n);
void tacc_round_bf16_to(const uint32_t *src, uint32_t *dst, long n);
int tacc_bf16_exact(const uint32_t *src, long n);

#endif
