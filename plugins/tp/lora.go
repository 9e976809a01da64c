package tp

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
)

// LoRA adapters under tensor parallel follow their base layer:
//
//	column-parallel base  A whole on every rank, B this rank's rows of the
//	                      output, split exactly as the base's output
//	                      (c_attn: the q, k and v rows of this rank's
//	                      heads). The input is the region's (replicated,
//	                      or gathered under sequence parallelism), so the
//	                      update of this rank's columns is exact; A's
//	                      gradient is a partial sum (each rank's output
//	                      columns contribute) and is summed over the group.
//	row-parallel base     A this rank's columns of the input, B whole: the
//	                      update x·Aᵀ·Bᵀ of this rank's input part is a
//	                      partial sum like the base's product and is added
//	                      to it before their sum over the group; B's
//	                      gradient is a partial sum and is summed.
//
// The input gradient needs nothing new: it is summed (column) or already
// this rank's part (row) with the base's.

// addAdapters adds the updates of ads on input x into y, the output of a
// column-parallel (column) or row-parallel layer before its collective.
// Each adapter's dropout draws the mask of one process on the elements x
// holds (nn.Adapter.Drop; a row-parallel input's columns start at Col0).
func (c *Comm) addAdapters(y, x *tensor.Tensor, p nn.Pass, ads []*nn.Adapter, column bool) (*tensor.Tensor, error) {
	for _, a := range ads {
		d, err := tensor.Apply("tp.lora", &loraFn{c: c, a: a, column: column}, a.Drop(x, p), a.A, a.B)
		if err != nil {
			return nil, err
		}
		if a.Lo == 0 && d.Dim(-1) == y.Dim(-1) {
			y = tensor.Add(y, d)
		} else {
			y = tensor.AddColumns(y, d, a.Lo)
		}
	}
	return y, nil
}

// loraFn is Scale·x·Aᵀ·Bᵀ of one adapter's local parts, in the order of
// one process's (nn.Adapter.Update: h = x·Aᵀ, then Scale·h, then ·Bᵀ), its
// products rounded to the compute dtype as one process's are (mixed
// precision). It reads A and B through the adapter in backward (ZeRO-3
// gathers them again by then) and keeps x and the rank-wide Scale·x·Aᵀ.
type loraFn struct {
	c      *Comm
	a      *nn.Adapter
	column bool
}

func (f *loraFn) Forward(ctx *tensor.FuncCtx, in ...*tensor.Tensor) (*tensor.Tensor, error) {
	x, A, B := in[0], in[1], in[2]
	k, r, out := x.Dim(-1), A.Dim(0), B.Dim(0)
	if A.Dim(1) != k || B.Dim(1) != r {
		return nil, fmt.Errorf("tp: adapter of %v with A %v and B %v", x.Shape(), A.Shape(), B.Shape())
	}
	rows := x.Numel() / k
	a := f.c.alloc()
	h := a.NewUninit(tensor.Activations, x.DType(), rows, r)
	shape := append(append([]int(nil), x.Shape()[:len(x.Shape())-1]...), out)
	y := a.NewUninit(tensor.Activations, x.DType(), shape...)
	d := a.Compute()
	if x.DType() == tensor.Float32 {
		loraForward(d, x.F32(), A.F32(), B.F32(), h.F32(), y.F32(), rows, k, r, out, float32(f.a.Scale))
	} else {
		loraForward(d, x.F64(), A.F64(), B.F64(), h.F64(), y.F64(), rows, k, r, out, f.a.Scale)
	}
	ctx.Save(x, h)
	ctx.Own(h)
	return y, nil
}

func loraForward[T cpu.Float](d tensor.DType, x, A, B, h, y []T, rows, k, r, out int, s T) {
	gemm(d, false, true, rows, r, k, x, k, A, k, h, r)
	cpu.Scale(h, s)
	gemm(d, false, true, rows, out, r, h, r, B, r, y, out)
}

func (f *loraFn) Backward(ctx *tensor.FuncCtx, g *tensor.Tensor) ([]*tensor.Tensor, error) {
	x, h := ctx.Saved()[0], ctx.Saved()[1]
	A, B := f.a.A, f.a.B
	k, r, out := x.Dim(-1), A.Dim(0), B.Dim(0)
	rows := x.Numel() / k
	a := backAlloc(ctx)
	var gx *tensor.Tensor // none when x takes no gradient (the first block's input under a frozen base)
	if x.NeedsGrad() {
		gx = a.New(tensor.Activations, x.DType(), x.Shape()...)
	}
	gA, gB := a.New(tensor.Activations, A.DType(), A.Shape()...), a.New(tensor.Activations, B.DType(), B.Shape()...)
	gh := a.NewUninit(tensor.Activations, x.DType(), rows, r)
	defer gh.Release()
	d := f.c.alloc().Compute()
	if x.DType() == tensor.Float32 {
		loraBackward(d, g.F32(), x.F32(), h.F32(), A.F32(), B.F32(), gh.F32(), data32(gx), gA.F32(), gB.F32(), rows, k, r, out, float32(f.a.Scale))
	} else {
		loraBackward(d, g.F64(), x.F64(), h.F64(), A.F64(), B.F64(), gh.F64(), data64(gx), gA.F64(), gB.F64(), rows, k, r, out, f.a.Scale)
	}
	partial := gB
	if f.column {
		partial = gA
	}
	if err := f.c.reduceGrads(a, "lora.grad", partial); err != nil {
		return nil, err
	}
	return []*tensor.Tensor{gx, gA, gB}, nil
}

// loraBackward: gB = gᵀ·h, gh = Scale·(g·B), gA = ghᵀ·x, gx = gh·A (gx
// nil: not wanted), h being the saved Scale·x·Aᵀ.
func loraBackward[T cpu.Float](d tensor.DType, g, x, h, A, B, gh, gx, gA, gB []T, rows, k, r, out int, s T) {
	gemm(d, true, false, out, r, rows, g, out, h, r, gB, r)
	gemm(d, false, false, rows, r, out, g, out, B, r, gh, r)
	cpu.Scale(gh, s)
	gemm(d, true, false, r, k, rows, gh, r, x, k, gA, k)
	if gx != nil {
		gemm(d, false, false, rows, k, r, gh, r, A, k, gx, k)
	}
}

// gemm is c = op(a)·op(b), in float32 rounding its operands to the compute
// dtype d (bf16, fp16) as the engine's products do.
func gemm[T cpu.Float](d tensor.DType, ta, tb bool, m, n, k int, a []T, lda int, b []T, ldb int, c []T, ldc int) {
	a32, ok := any(a).([]float32)
	if !ok {
		cpu.Gemm(ta, tb, m, n, k, 1, a, lda, b, ldb, 0, c, ldc)
		return
	}
	b32, c32 := any(b).([]float32), any(c).([]float32)
	switch d {
	case tensor.BFloat16:
		cpu.GemmRoundBF16(ta, tb, m, n, k, 1, a32, lda, b32, ldb, 0, c32, ldc)
	case tensor.Float16:
		cpu.GemmRoundF16(ta, tb, m, n, k, 1, a32, lda, b32, ldb, 0, c32, ldc)
	default:
		cpu.Gemm(ta, tb, m, n, k, 1, a32, lda, b32, ldb, 0, c32, ldc)
	}
}

func data32(t *tensor.Tensor) []float32 {
	if t == nil {
		return nil
	}
	return t.F32()
}

func data64(t *tensor.Tensor) []float64 {
	if t == nil {
		return nil
	}
	return t.F64()
}

// unwrapAdapters takes the adapters off a block's four linear layers,
// leaving the base layers for Prepare to split, and returns them by slot.
func unwrapAdapters(b *nn.Block) [4][]*nn.Adapter {
	var ads [4][]*nn.Adapter
	for s := nn.SlotAttn; s <= nn.SlotMlpProj; s++ {
		l := b.Layer(s)
		ads[s] = nn.Adapters(*l)
		*l = nn.Unwrap(*l)
	}
	return ads
}
