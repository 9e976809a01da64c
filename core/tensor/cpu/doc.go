// Package cpu holds the CPU compute kernels of the tensor package: matrix
// products, GELU, LayerNorm, causal self-attention (also of queries over
// blocks of keys at given positions, with partial results merged through
// the log-sum-exp), softmax cross-entropy, AdamW and a few vector helpers.
//
// Every kernel is a pure function on row-major slices, generic over float32
// and float64. float32 is the training path and is tuned for speed: exp is
// a polynomial approximation accurate to about one float32 ulp instead of
// the float64 routine of package math, which would dominate the step time,
// and in the cgo build the elementwise and row loops (GELU, softmax,
// LayerNorm, the attention backward's exp, AdamW, the bf16 conversions)
// run as C that the compiler vectorises or that is written with AVX-512
// intrinsics. Those C loops repeat the Go loops operation for operation, so
// the cgo and pure-Go builds agree bitwise on these kernels. float64 exists for finite-difference gradient checks, so
// it keeps the exact math routines.
//
// Matrix products go to OpenBLAS through cgo, or to a blocked pure-Go
// kernel when cgo is off or the purego build tag is set (BLASName says
// which). Half-precision products (GemmBF16 and GemmF16, and GemmRoundBF16
// and GemmRoundF16 on float32 operands) take bf16 or fp16 operands and
// accumulate in float32: on a CPU with AVX512-BF16 in the cgo build bf16
// runs a kernel of its own (gemm_bf16.c), elsewhere (or with
// TINYACC_BF16_KERNEL=off) the operands are widened and the float32 Gemm
// runs (HalfGemmPath says which); half.go converts with round to nearest
// even, on F16C for fp16 in the cgo build (half_f16c.c).
//
// Kernels split their work over a small pool of goroutines (see SetThreads
// and ParallelFor). Every reduction is arranged so that its result does not
// depend on the number of threads: the same inputs give bitwise the same
// outputs whatever Threads() is, which keeps training runs reproducible
// across machines with different core counts.
//
// Gradient kernels (the ...Backward functions) accumulate into their outputs
// unless their documentation says otherwise, because the autograd layer sums
// the contributions of every use of a tensor.
package cpu
