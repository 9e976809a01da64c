// Vectorised float32 loops for the cgo build; see fastpath_cgo.go.
#ifndef TINYACC_CPU_FASTPATH_H
#define TINYACC_CPU_FASTPATH_H

#include <stdint.h>

void tacc_gelu_fwd(const float *x, float *y, long n);
void tacc_gelu_bwd(const float *x, const float *dy, float *dx, long n);
void tacc_gelu_bwd_bf16(const uint16_t *x, const float *dy, float *dx, long n);
void tacc_softmax_rows(const float *src, float *dst, long rows, long n, float *maxs, float *sums);
void tacc_softmax_prefix(float *att, long ld, long width, long rows, const int64_t *lens, float *maxs, float *sums);

void tacc_layernorm_fwd(const float *x, const float *w, const float *b, float *y, float *mean, float *rstd,
			long rows, long cols, float eps);
void tacc_layernorm_bwd(const float *dy, const float *x, const float *w, const float *mean, const float *rstd,
			float *dx, float *pw, float *pb, long rows, long cols);

void tacc_col_sums(const float *dy, float *p, long rows, long cols);
void tacc_add_bias(float *y, const float *b, long rows, long cols);
void tacc_add(const float *x, const float *y, float *z, long n);
void tacc_axpy(float a, const float *x, float *y, long n);

void tacc_bf16_from_f32(const uint32_t *src, uint16_t *dst, long n);
void tacc_bf16_to_f32(const uint16_t *src, uint32_t *dst, long n);
void tacc_round_bf16(uint32_t *x, long n);
void tacc_exp_minus(float *row, long n, float lse);
void tacc_lse_backward(const float *p, float *dp, long n, float delta);
void tacc_adamw(float *p, const float *g, float *m, float *v, long n, float gscale, float decay, float b1, float b2,
		float ob1, float ob2, float step, float bc2_sqrt, float eps);
void tacc_lse_rows(float *lse, const float *maxs, const float *sums, long n);
void tacc_attn_delta(const float *dout, const float *out, float *delta, long lo, long hi, long tq, long nh,
		     long hs, long ldo);
void tacc_exp_minus_rows(float *p, long ld, long rows, const int64_t *lens, const int64_t *ends, const float *lse);
void tacc_lse_backward_rows(const float *p, float *dp, long ld, long rows, const int64_t *lens,
			    const int64_t *ends, const float *delta);

void tacc_gelu_bwd_set(const float *x, const float *dy, float *dx, long n);
void tacc_gelu_bwd_bf16_set(const uint16_t *x, const float *dy, float *dx, long n);
void tacc_layernorm_bwd_set(const float *dy, const float *x, const float *w, const float *mean, const float *rstd,
			    float *dx, float *pw, float *pb, long rows, long cols);
void tacc_bf16_from_f32_stream(const uint32_t *src, uint16_t *dst, long n);

void tacc_silu_mul_fwd(const float *x, float *y, long rows, long n);
void tacc_silu_mul_bwd(const float *x, const float *dy, float *dx, long rows, long n);

void tacc_rmsnorm_fwd(const float *x, const float *w, float *y, float *rstd, long rows, long cols, float eps);
void tacc_rmsnorm_bwd(const float *dy, const float *x, const float *w, const float *rstd, float *dx, float *pw, long rows,
		      long cols);

void tacc_rope_rotate(const float *x, float *y, long lo, long hi, long T, long ld, long col, long n, long h, const double *cs,
		      const double *sn, double sign);


#endif
