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
// The weights are stored twice, as in Megatron: the float32 master the
// optimizer updates, counted with the optimizer state (accountAs), and a
// 2-byte copy in the compute dtype, counted as the parameters, which the
// products read. The copy is made when a product first reads the
// parameter and dropped whenever the master changes (DropHalf after an
// optimizer step, Release, Alias, DropStorage), so it always holds the
// latest master rounded to nearest even: the numbers are those of
// rounding the master as the product reads it, bitwise. Other operands
// (activations, output gradients) are float32 tensors rounded as the
// product reads them.

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

// accountAs is the category storage of category cat and dtype d is
// counted in: under mixed precision a float32 parameter is a master, whose
// bytes are counted with the optimizer state; the parameters' count is
// their half-precision copies.
func (a *Allocator) accountAs(cat Category, d DType) Category {
	if cat == Params && d == Float32 && a.compute != Float32 {
		return OptimState
	}
	return cat
}

// halfOf returns the copy in compute dtype d of parameter w that products
// read, making it if w has none; nil for tensors that are not parameters
// with storage of their own (views, activations), which the product
// rounds as it reads them.
func halfOf(w *Tensor, d DType) *Tensor {
	if w.dtype != Float32 || w.Name == "" || w.node != nil || w.cat != Params || w.f32 == nil {
		return nil
	}
	if h := w.half; h != nil && h.dtype == d {
		return h
	}
	w.dropHalf()
	a := w.home
	if a == nil {
		a = Default
	}
	h := a.NewUninit(Params, d, w.shape...)
	if d == Float16 {
		cpu.F16FromF32s(h.u16, w.f32)
	} else {
		cpu.BF16FromF32s(h.u16, w.f32)
	}
	w.half = h
	return h
}

// dropHalf releases t's half-precision copy, if it has one.
func (t *Tensor) dropHalf() {
	if h := t.half; h != nil {
		t.half = nil
		h.Release()
	}
}

// DropHalf releases the half-precision copies of params; the trainer calls
// it after every change of the masters it does not make through Release,
// Alias or DropStorage (an optimizer step, a load), so the next product
// reads the new values.
func DropHalf(params []*Tensor) {
	for _, p := range params {
		p.dropHalf()
	}
}

// HalfBytes is the storage of the half-precision copies params hold now.
func HalfBytes(params []*Tensor) int64 {
	var n int64
	for _, p := range params {
		if p.half != nil {
			n += p.half.Bytes()
		}
	}
	return n
}

// gemmW is gemm32 with w, a parameter or an activation, as operand B: a
// parameter's half-precision copy is read as it is stored.
func gemmW(d DType, ta, tb bool, m, n, k int, a []float32, lda int, w *Tensor, ldb int, beta float32, c []float32, ldc int) {
	if d != Float32 {
		if h := halfOf(w, d); h != nil {
			cpu.GemmRoundAHalfB(d == Float16, ta, tb, m, n, k, 1, a, lda, h.u16, ldb, beta, c, ldc)
			return
		}
	}
	gemm32(d, ta, tb, m, n, k, a, lda, w.f32, ldb, beta, c, ldc)
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
