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
//     them hold (the output gradient two products of a backward read is
//     rounded once for both on the portable path: roundOnce);
//   - their results come out of the float32 accumulator unrounded: weight
//     gradients stay float32 (Megatron's main gradients) and accumulate in
//     float32 across micro-batches (what crosses ranks between layers,
//     tensor parallel's partial sums included, travels in the compute
//     dtype: comm.AllReduceAs and its kin);
//   - the attention's products are half-precision products too, forward
//     and backward (cpu.AttnDims.HalfProducts): q·k^T, P·v, dout·v^T,
//     dS·k, dS^T·q and P^T·dout, with P and dS rounded as the products
//     read them;
//   - everything else (LayerNorm statistics, GELU, softmax, the attention's
//     log-sum-exp, delta and dS, cross-entropy and the loss) computes in
//     float32.
//
// The weights are stored twice, as in Megatron: the float32 master the
// optimizer updates, counted with the optimizer state (accountAs), and a
// 2-byte copy in the compute dtype, counted as the parameters, which the
// products read (the other ops that read a parameter round what they read
// to the same values: "Parameters in every op" below). The copy is made when a product first reads the
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
	convGrain(len(w.f32), func(lo, hi int) { NarrowHalf(d, h.u16[lo:hi], w.f32[lo:hi]) })
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

// Parameters in every op. Under mixed precision the parameters the
// forward and backward read are the half-precision copies of the float32
// masters, in every op, as Megatron's model parameters are (the masters
// are only the optimizer's): the products read the stored 2-byte copy
// (halfOf) and the ops that read a parameter otherwise (the embedding
// lookups, LayerNorm's and RMSNorm's weights and biases, a Linear's bias,
// a strategy's own forms of them) round what they read to the compute
// dtype (ParamRound, ReadParam): the same values. So one process reads
// what a ZeRO rank, which knows the other ranks' parameters only through
// their 2-byte copies, reads, and every layout computes with the same
// parameter values. A parameter's gradient is the gradient of its copy,
// accumulated in float32. Rounding a value that is already a copy (ZeRO's
// widened units) leaves it unchanged.

// ParamRound rounds vals, values an op read from parameter p (a table's
// rows, a copy of a vector), in place to p's compute dtype, which is what
// p's 2-byte copy holds; a no-op outside mixed precision and for float64.
func ParamRound(p *Tensor, vals []float32) {
	if p.dtype != Float32 {
		return
	}
	switch computeOf(p) {
	case BFloat16:
		convGrain(len(vals), func(lo, hi int) { cpu.RoundBF16(vals[lo:hi]) })
	case Float16:
		convGrain(len(vals), func(lo, hi int) { cpu.RoundF16(vals[lo:hi]) })
	}
}

// ReadParam returns the values an op reads of parameter p (a norm's
// weight or bias, a bias: vectors) and the function that gives them back:
// p itself and a no-op outside mixed precision; under it a transient
// float32 activation holding p rounded to the compute dtype.
func ReadParam(p *Tensor) (*Tensor, func()) {
	if p == nil || p.dtype != Float32 || computeOf(p) == Float32 {
		return p, func() {}
	}
	a := p.home
	if a == nil {
		a = Default
	}
	v := a.NewUninit(Activations, Float32, p.shape...)
	copy(v.f32, p.f32)
	ParamRound(p, v.f32)
	return v, v.Release
}

// NarrowHalf rounds src into dst, the 2-byte dtype d's bits (BFloat16 or
// Float16), to nearest even: the one conversion every half-precision
// copy, wire and stored activation uses.
func NarrowHalf(d DType, dst []uint16, src []float32) {
	if d == Float16 {
		cpu.F16FromF32s(dst, src)
	} else {
		cpu.BF16FromF32s(dst, src)
	}
}

// WidenHalf sets dst to the float32 values of src, the 2-byte dtype d's
// bits (BFloat16 or Float16): exact, every half value being a float32.
func WidenHalf(d DType, dst []float32, src []uint16) {
	if d == Float16 {
		cpu.F16ToF32s(dst, src)
	} else {
		cpu.BF16ToF32s(dst, src)
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

// operandOf is tensor t as an operand of a product in compute dtype d:
// its 2-byte copy in d (a parameter's, halfOf, a stored activation's, or
// one made as its values were written, early.go), read as it is stored,
// or else its float32 values, which the product rounds as it reads them
// (an activation stored in another dtype is widened back first).
func operandOf(d DType, t *Tensor) cpu.HalfOperand {
	h := storedHalf(t)
	if d != Float32 && h == nil && t.early != nil && t.f32 != nil {
		h = t.early
	}
	if d != Float32 && h == nil {
		h = halfOf(t, d)
	}
	if h != nil && h.dtype == d {
		return cpu.HalfOperand{H: h.u16}
	}
	if h != nil {
		refill(t) // stored in another dtype: read widened
	}
	return cpu.HalfOperand{F: t.f32}
}

// gemmDBias sets C (m x n, stride n) to a·b (b stored k x n) plus
// bias[j] on column j of every row (nil: no bias), as gemmD with beta 0
// followed by cpu.AddBias, bitwise; where b is a bf16 copy read as stored
// (and a float32 or bf16, halfInput), it is one product that adds the
// bias as it stores C (cpu.GemmHalfOperandBias): a Linear layer's forward.
func gemmDBias(d DType, m, n, k int, a, b cpu.HalfOperand, bias, c []float32) {
	if bias != nil && d == BFloat16 && !a.Exact && b.H != nil {
		cpu.GemmHalfOperandBias(false, false, false, m, n, k, 1, a, k, b.H, n, bias, c, n)
		return
	}
	gemmD(d, false, false, m, n, k, a, k, b, n, 0, c, n)
	if bias != nil {
		cpu.AddBias(c, bias, m, n)
	}
}

// f32Operand is a float32 slice as an operand, rounded as it is read.
func f32Operand(x []float32) cpu.HalfOperand { return cpu.HalfOperand{F: x} }

// gemmD is cpu.Gemm on float32 operands in compute dtype d: under mixed
// precision a half-precision product (cpu.GemmHalfOperands), which reads
// 2-byte operands as they are stored and rounds float32 ones.
func gemmD(d DType, ta, tb bool, m, n, k int, a cpu.HalfOperand, lda int, b cpu.HalfOperand, ldb int, beta float32, c []float32, ldc int) {
	if d == Float32 {
		cpu.Gemm(ta, tb, m, n, k, 1, a.F, lda, b.F, ldb, beta, c, ldc)
		return
	}
	cpu.GemmHalfOperands(d == Float16, ta, tb, m, n, k, 1, a, lda, b, ldb, beta, c, ldc)
}

// roundOnce returns g, a float32 gradient of rows x cols that the
// products of a backward read, as the operand they read, with the
// function that gives its storage back: when both (two products will read
// it now), under mixed precision on the portable path, g rounded once
// (cpu.RoundHalfOnce) rather than once by each product; else g as it is.
func roundOnce(d DType, g []float32, rows, cols int, both bool) (cpu.HalfOperand, func()) {
	if !both || d == Float32 || d == Float64 {
		return f32Operand(g), func() {}
	}
	return cpu.RoundHalfOnce(d == Float16, g, rows, cols)
}

// Activations kept for the backward in the compute dtype. Under mixed
// precision the forward computes in float32 as above, and what it keeps
// for the backward is stored in 2 bytes, as autocast and Megatron keep
// their bf16 activations: once a transformer block's forward is done
// (StoreHalf), every float32 activation of its graph that still owns its
// storage (the block's input, the norms' outputs, q|k|v, the MLP's
// hidden layer and activation, the residual between
// attention and MLP, whatever a strategy's layers keep) is rounded to the
// compute dtype (to nearest even) and its float32 storage given back.
// The backward widens each one into float32 storage, exactly, just
// before the first op backward that reads it (refill, as selective
// recomputation forms its dropped outputs again) and gives it back after
// its producer's backward, its last reader. The ops whose backwards read
// their inputs as stored (node.readsHalf) leave them so: the matrix
// products of Linear's, LinearT's and MatMulT's backwards read the 2-byte
// copy as it is (storedHalf), and GELU's, LayerNorm's, RMSNorm's and
// SwiGLU's kernels widen theirs a piece at a time into cache as they read
// them, so one that only these read (the
// norms' outputs, the MLP's hidden layer and activation, the block's
// input and middle residual) is never widened into float32 storage of
// its own. What is not a tensor of the graph stays float32: the norms'
// statistics, the attention's log-sum-exp, the cross-entropy's
// probabilities, the loss and every gradient.
//
// The forward reads the float32 values and the backward the rounded ones:
// a matrix product's weight gradient is unchanged (the product rounds
// its operands as it reads them anyway); the norms' and GELU's backwards
// read an input rounded to 8 (bf16) or 11 (fp16) significant bits, the
// error of a bf16 activation. The attention is kept consistent: q|k|v
// are rounded where they are made (RoundHalf), so its forward and its
// log-sum-exp see what its backward reads, and its output stays float32
// (node.exact): the backward's dout·out must be that of the output the
// log-sum-exp and the probabilities made, or delta moves every row of dS
// by the output's rounding. (The gradients that are zero in theory, the
// key bias's, since softmax ignores a shift of a row's scores, carry
// rounding noise all the same: the half-precision products round dS as
// they read it, as autocast's do, and AdamW turns that noise into steps
// of about the learning rate.)

// StoreHalf stores in the compute dtype every activation of the graph
// from in to out (a block's input and output: in is included, out, which
// the forward reads next, is not) that the backward keeps; a no-op
// outside mixed precision, for float32 and float64 alike. The forward
// must have no more use for them: the next read of one is the backward's.
func StoreHalf(out, in *Tensor) {
	if out == nil || out.node == nil || computeOf(out) == out.dtype {
		return
	}
	seen := map[*Tensor]bool{out: true}
	stack := append([]*Tensor(nil), out.node.inputs...)
	for len(stack) > 0 {
		t := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if t == nil || seen[t] {
			continue
		}
		seen[t] = true
		if t.base != nil {
			storeHalf(t.base)
		} else {
			storeHalf(t)
		}

		if t != in && t.node != nil {
			stack = append(stack, t.node.inputs...)
		}
	}
}

// storeHalf rounds activation t into a 2-byte copy in its compute dtype
// and gives its float32 storage back (and points its views at none); only
// a recorded float32 activation owning its storage, not dropped, is
// stored. A copy made as t's values were written (early.go) is the
// stored one: the same bits, rounded once.
func storeHalf(t *Tensor) {
	d := computeOf(t)
	if !storable(t, d) {
		return
	}
	a := t.home
	if a == nil {
		a = Default
	}
	h := t.early // written with t's values (early.go)
	if h == nil || h.dtype != d {
		h = a.NewUninit(Activations, d, t.shape...)
		convGrain(len(t.f32), func(lo, hi int) { NarrowHalf(d, h.u16[lo:hi], t.f32[lo:hi]) })
	} else {
		t.early = nil
	}
	t.releaseStorage()
	t.half = h
	t.dropView()
}

// storable says storeHalf would store activation t in compute dtype d.
func storable(t *Tensor, d DType) bool {
	return t.dtype == Float32 && d != Float32 && t.cat == Activations && t.node != nil && !t.node.exact && t.alloc != nil && !t.dropped && t.half == nil
}

// halfInput is activation x as the left operand of a Linear's forward
// product in compute dtype d. On the bf16 kernel, for an activation that
// StoreHalf will store once the forward is done with it, the product
// reads x's 2-byte copy where it is stored (cpu.GemmHalfOperandBias)
// rather than rounding x as it packs it: the copy its op wrote as it made
// x (a norm's output, the MLP's activation; early.go), or one narrowed
// now, while x is fresh in cache (the attention's output). StoreHalf then
// keeps that copy instead of rounding x again. The numbers are the ones
// the product would round x to, bitwise. Elsewhere (the portable path,
// which would widen the copy again; a view; a forward StoreHalf does not
// follow) it is x's float32 values, rounded as read.
func halfInput(d DType, x *Tensor) cpu.HalfOperand {
	if d != BFloat16 || !cpu.HalfKernel(false) || x.base != nil || !storable(x, d) || len(x.f32) == 0 {
		return f32Operand(x.f32)
	}
	if x.early == nil {
		if e := earlyHalf(x, true); e != nil {
			convGrain(len(x.f32), func(lo, hi int) { NarrowHalf(d, e.u16[lo:hi], x.f32[lo:hi]) })
			keepEarly(x, e)
		}
	}
	if x.early == nil || x.early.dtype != d {
		return f32Operand(x.f32)
	}
	return cpu.HalfOperand{H: x.early.u16}
}

// widen gives stored activation t float32 storage again, holding its
// 2-byte copy's values exactly, and releases the copy.
func widen(t *Tensor) {
	a := t.home
	if a == nil {
		a = Default
	}
	n := a.NewUninit(t.cat, Float32, t.shape...)
	d := t.half.dtype
	convGrain(len(n.f32), func(lo, hi int) { WidenHalf(d, n.f32[lo:hi], t.half.u16[lo:hi]) })
	t.dropHalf()
	t.f32, t.alloc = n.f32, a
	t.refilled = true
	for _, v := range t.views {
		v.f32 = t.f32
	}
}

// stored reports whether t is an activation kept in its 2-byte form.
func (t *Tensor) stored() bool { return t.half != nil && t.cat == Activations }

// storedHalf is the 2-byte copy of activation t (or of the activation t
// views, whose elements t shares in the same order) while it is kept
// stored, nil otherwise. A matrix product in the backward reads it as it
// is, without the widening: the product rounds a float32 operand to the
// compute dtype as it reads it, and rounding the exactly widened copy
// gives back the stored numbers, so the result is the same bitwise. The
// ops whose backwards read their inputs so (node.readsHalf) leave them
// stored, and the ops' other readers and producers widen or release them
// as before.
func storedHalf(t *Tensor) *Tensor {
	if t.base != nil {
		t = t.base
	}
	if !t.stored() {
		return nil
	}
	return t.half
}

// StoredHalf returns the 2-byte copy's bits of activation t while it is
// stored in its compute dtype (StoreHalf, storedHalf), with that dtype;
// nil when t is not stored (its float32 storage holds its values). A
// backward that reads its inputs as stored (FuncCtx.ReadsHalf) widens
// what it needs.
func (t *Tensor) StoredHalf() ([]uint16, DType) {
	h := storedHalf(t)
	if h == nil {
		return nil, t.dtype
	}
	return h.u16, h.dtype
}

// RoundHalf rounds activation t's elements in place to its compute dtype
// (to nearest even), keeping float32 storage; a no-op outside mixed
// precision. The block rounds q|k|v so that the attention's forward, its
// log-sum-exp included, and its backward, which reads them stored in 2
// bytes, see the same numbers, as an attention on bf16 inputs does.
func RoundHalf(t *Tensor) {
	t.dropEarly()
	switch d := computeOf(t); {
	case t.dtype != Float32 || t.f32 == nil:
	case roundHalfInto(t): // with the copy StoreHalf takes (early.go)
	case d == BFloat16:
		convGrain(len(t.f32), func(lo, hi int) { cpu.RoundBF16(t.f32[lo:hi]) })
	case d == Float16:
		convGrain(len(t.f32), func(lo, hi int) { cpu.RoundF16(t.f32[lo:hi]) })
	}
}

// convGrain runs an elementwise conversion of n elements over the
// kernels' threads, in chunks large enough to pay for the hand-off.
func convGrain(n int, fn func(lo, hi int)) { cpu.ParallelFor(n, 1<<16, fn) }
