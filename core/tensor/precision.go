package tensor

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/tensor/cpu"
)

// Mixed precision. An allocator's compute dtype (SetCompute) makes the
// matrix products of the float32 tensors belonging to that rank run in
// bf16 or fp16 with float32 accumulation, as PyTorch's autocast and
// Megatron do:
//
//   - Linear and MatMulT round both operands to the compute dtype as the
//     product reads them (cpu.GemmRoundBF16/GemmRoundF16), in forward and
//     in backward: the weights they see are half-precision copies of the
//     float32 masters, refreshed whenever the masters change, and the
//     activations and output gradients are what half-precision copies of
//     them hold;
//   - their results come out of the float32 accumulator unrounded: weight
//     gradients stay float32 (Megatron's main gradients) and accumulate in
//     float32 across micro-batches (what crosses ranks between layers,
//     tensor parallel's partial sums included, travels in the compute
//     dtype: comm.AllReduceAs and its kin);
//   - everything else (LayerNorm statistics, GELU, softmax, the attention
//     and its log-sum-exp, cross-entropy and the loss) computes in float32.
//
// The storage stays float32: the rounding reproduces the numbers of the
// half-precision operands, not their bytes.

// SetCompute sets the dtype of the matrix products of this allocator's
// tensors: Float32 (the tensors' own; the default), BFloat16 or Float16.
// Float64 tensors always compute in float64.
func (a *Allocator) SetCompute(d DType) {
	if d != Float32 && d != BFloat16 && d != Float16 {
		panic(fmt.Sprintf("tensor: compute dtype %s: use float32, bfloat16 or float16", d))
	}
	a.mu.Lock()
	a.compute = d
	a.mu.Unlock()
}

// Compute reports the dtype set by SetCompute.
func (a *Allocator) Compute() DType {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.compute
}

// computeOf is the compute dtype of an op on t: its rank's, for float32
// tensors.
func computeOf(t *Tensor) DType {
	if t.dtype != Float32 {
		return t.dtype
	}
	a := t.home
	if a == nil {
		a = Default
	}
	return a.Compute()
}

// gemm32 is cpu.Gemm on float32 slices in compute dtype d.
func gemm32(d DType, ta, tb bool, m, n, k int, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	switch d {
	case BFloat16:
		cpu.GemmRoundBF16(ta, tb, m, n, k, 1, a, lda, b, ldb, beta, c, ldc)
	case Float16:
		cpu.GemmRoundF16(ta, tb, m, n, k, 1, a, lda, b, ldb, beta, c, ldc)
	default:
		cpu.Gemm(ta, tb, m, n, k, 1, a, lda, b, ldb, beta, c, ldc)
	}
}
