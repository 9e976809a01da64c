package tp

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
)

// ColumnParallel is a Linear whose output columns are split over the
// group: W [in, out/N] and B [out/N] are this rank's columns, and the
// output is this rank's columns of x·W + B. Its input is replicated (Copy:
// the input gradient is the sum of the ranks' parts) or, under sequence
// parallelism, this rank's part of the sequence (GatherSeq: all-gathered
// before the product, the gradient reduce-scattered back).
//
// Gather, the naive form, all-gathers the output columns so every rank
// holds the whole x·W + B; training leaves it off and hands the split
// columns to the row-parallel layer after.
//
// Ws, in place of W and B, are this rank's rows of bias-free weights in
// nn.Linear's [out, in] layout whose products sit side by side (Llama's
// q|k|v and gate|up: tensor.LinearT).
type ColumnParallel struct {
	W, B   *tensor.Tensor
	Ws     []*tensor.Tensor
	C      *Comm
	SP     bool
	Gather bool
	// Adapters are LoRA's beside the frozen base (lora.go): A whole, B
	// this rank's rows, Lo the local column their update starts at.
	Adapters []*nn.Adapter
}

// Forward implements nn.Layer.
func (l *ColumnParallel) Forward(x *tensor.Tensor, p nn.Pass) (*tensor.Tensor, error) {
	var in *tensor.Tensor
	var err error
	if l.SP {
		in, err = l.C.GatherSeq(x)
	} else {
		in, err = l.C.Copy(x)
	}
	if err != nil {
		return nil, err
	}
	var y *tensor.Tensor
	if l.Ws != nil {
		y = tensor.LinearT(in, l.Ws...)
	} else {
		y = tensor.Linear(in, l.W, l.B)
	}
	if y, err = l.C.addAdapters(y, in, p, l.Adapters, true); err != nil || l.Ws != nil {
		return y, err
	}
	if !l.Gather {
		return y, nil
	}
	widths := make([]int, l.C.G.Size()) // every rank's output columns
	for i := range widths {
		widths[i] = l.W.Dim(1)
	}
	return l.C.GatherLast(y, widths)
}

// RowParallel is a Linear whose input rows are split over the group: W
// [in/N, out] is this rank's rows, x [..., in/N] this rank's part of the
// input (a column-parallel layer's output), and the ranks' products x·W
// are partial sums. They are summed (Reduce) or, under sequence
// parallelism, summed and scattered along the sequence (ScatterSeq), and
// only then is the bias B [out], which every rank holds whole, added once.
// Under sequence parallelism each rank adds it to its part of the
// sequence, so its gradient is a partial sum, summed over the group in
// backward.
//
// Split, the naive form, takes the whole input x [..., in] and uses this
// rank's columns of it.
//
// T says W is [out, in/N], nn.Linear's layout (Llama's o_proj and
// down_proj, without bias).
type RowParallel struct {
	W, B  *tensor.Tensor
	C     *Comm
	SP    bool
	Split bool
	T     bool
	// Adapters are LoRA's beside the frozen base (lora.go): A this
	// rank's input columns, B whole.
	Adapters []*nn.Adapter
}

// Forward implements nn.Layer.
func (l *RowParallel) Forward(x *tensor.Tensor, p nn.Pass) (*tensor.Tensor, error) {
	if l.Split {
		k := l.W.Dim(0)
		if l.T {
			k = l.W.Dim(1)
		}
		lo := l.C.G.Rank() * k
		if x.Dim(-1) != k*l.C.G.Size() {
			return nil, fmt.Errorf("tp: row-parallel layer of %d rows per rank given an input of width %d", k, x.Dim(-1))
		}
		x = tensor.Columns(x, lo, lo+k)
	}
	var y *tensor.Tensor
	if l.T {
		y = tensor.MatMulT(x, l.W)
	} else {
		y = tensor.Linear(x, l.W, nil)
	}
	y, err := l.C.addAdapters(y, x, p, l.Adapters, false)
	if err != nil {
		return nil, err
	}
	if l.SP {
		y, err = tensor.Apply("tp.scatter_seq", &scatterSeqFn{c: l.C, consume: true}, y)
	} else {
		y, err = tensor.Apply("tp.reduce", &reduceFn{c: l.C, inPlace: true}, y)
	}
	if err != nil || l.B == nil {
		return y, err
	}
	return tensor.Apply("tp.add_bias", &addBiasFn{c: l.C, partial: l.SP}, y, l.B)
}

// addBiasFn adds b [C] to every row of y [..., C] in place (y is the
// output of a collective, which no backward reads) and returns a view of
// it. partial: the rows are this rank's part of the sequence, so b's
// gradient is summed over the group.
type addBiasFn struct {
	c       *Comm
	partial bool
}

func (f *addBiasFn) Forward(_ *tensor.FuncCtx, in ...*tensor.Tensor) (*tensor.Tensor, error) {
	y, b := in[0], in[1]
	C := b.Numel()
	if y.Dim(-1) != C {
		return nil, fmt.Errorf("tp: bias of %d added to rows of %d", C, y.Dim(-1))
	}
	if y.DType() == tensor.Float32 {
		bv, done := tensor.ReadParam(b) // the bias's copy under mixed precision
		cpu.AddBias(y.F32(), bv.F32(), y.Numel()/C, C)
		done()
	} else {
		cpu.AddBias(y.F64(), b.F64(), y.Numel()/C, C)
	}
	return y.Reshape(y.Shape()...), nil
}

func (f *addBiasFn) Backward(ctx *tensor.FuncCtx, g *tensor.Tensor) ([]*tensor.Tensor, error) {
	C := g.Dim(-1)
	gb := backAlloc(ctx).New(tensor.Activations, g.DType(), C)
	if g.DType() == tensor.Float32 {
		cpu.BiasGrad(g.F32(), gb.F32(), g.Numel()/C, C)
	} else {
		cpu.BiasGrad(g.F64(), gb.F64(), g.Numel()/C, C)
	}
	if f.partial {
		if err := f.c.reduceGrads(backAlloc(ctx), "bias.grad", gb); err != nil {
			return nil, err
		}
	}
	return []*tensor.Tensor{g, gb}, nil
}

// LayerNorm is a LayerNorm under sequence parallelism: it normalises this
// rank's part of the sequence with the whole weight and bias, which every
// rank holds, so their gradients are partial sums; its backward sums them
// over the group (one all-reduce of both) before they reach the
// parameters. Gradient accumulation, data parallel's buckets and ZeRO's
// reduce-scatters therefore see the full gradient, identical on every rank
// of the group, as they do without tensor parallelism.
type LayerNorm struct {
	W, B *tensor.Tensor
	C    *Comm
}

// Forward implements nn.Layer.
func (l *LayerNorm) Forward(x *tensor.Tensor, _ nn.Pass) (*tensor.Tensor, error) {
	return tensor.Apply("tp.layernorm", &layerNormFn{l: l}, x, l.W, l.B)
}

type layerNormFn struct{ l *LayerNorm }

func (f *layerNormFn) Forward(ctx *tensor.FuncCtx, in ...*tensor.Tensor) (*tensor.Tensor, error) {
	x, w, b := in[0], in[1], in[2]
	C := x.Dim(-1)
	if w.Numel() != C || b.Numel() != C {
		return nil, fmt.Errorf("tp: LayerNorm of %v with weight %v and bias %v", x.Shape(), w.Shape(), b.Shape())
	}
	rows := x.Numel() / C
	a := f.l.C.alloc()
	y := a.NewUninit(tensor.Activations, x.DType(), x.Shape()...)
	mean, rstd := a.NewUninit(tensor.Activations, x.DType(), rows), a.NewUninit(tensor.Activations, x.DType(), rows)
	layerNormForward(x, w, b, y, mean, rstd)
	// x is kept for backward; w is read then, through the parameter
	// (ZeRO-3 gathers it again before this module's backward).
	ctx.Save(x, mean, rstd)
	ctx.Own(mean, rstd)
	return y, nil
}

// Refill implements tensor.Refiller: the same kernel on the kept input
// forms the output again, bitwise, with no communication (the statistics,
// equal to the kept ones, are left alone), so selective recomputation's
// norm drops this rank's part of the sequence under sequence parallel.
func (f *layerNormFn) Refill(ctx *tensor.FuncCtx, y *tensor.Tensor) {
	x, w, b := ctx.Saved()[0], f.l.W, f.l.B
	C := x.Dim(-1)
	rows := x.Numel() / C
	a := f.l.C.alloc()
	mean, rstd := a.NewUninit(tensor.Activations, x.DType(), rows), a.NewUninit(tensor.Activations, x.DType(), rows)
	layerNormForward(x, w, b, y, mean, rstd)
	mean.Release()
	rstd.Release()
}

// layerNormForward is the forward of the forward and of Refill, reading
// the parameters' copies under mixed precision (tensor.ReadParam).
func layerNormForward(x, w, b, y, mean, rstd *tensor.Tensor) {
	C := x.Dim(-1)
	rows := x.Numel() / C
	if x.DType() == tensor.Float32 {
		wv, doneW := tensor.ReadParam(w)
		bv, doneB := tensor.ReadParam(b)
		cpu.LayerNormForward(x.F32(), wv.F32(), bv.F32(), y.F32(), mean.F32(), rstd.F32(), rows, C, float32(nn.LayerNormEps))
		doneW()
		doneB()
	} else {
		cpu.LayerNormForward(x.F64(), w.F64(), b.F64(), y.F64(), mean.F64(), rstd.F64(), rows, C, nn.LayerNormEps)
	}
}

// OutputUnread implements tensor.Refiller: the backward reads x and the
// statistics.
func (f *layerNormFn) OutputUnread() bool { return true }

func (f *layerNormFn) Backward(ctx *tensor.FuncCtx, g *tensor.Tensor) ([]*tensor.Tensor, error) {
	s := ctx.Saved()
	x, mean, rstd := s[0], s[1], s[2]
	w, b := f.l.W, f.l.B
	C := x.Dim(-1)
	rows := x.Numel() / C
	a := backAlloc(ctx)
	gx := a.New(tensor.Activations, x.DType(), x.Shape()...)
	gw, gb := a.New(tensor.Activations, w.DType(), C), a.New(tensor.Activations, b.DType(), C)
	if x.DType() == tensor.Float32 {
		wv, done := tensor.ReadParam(w)
		cpu.LayerNormBackward(g.F32(), x.F32(), wv.F32(), mean.F32(), rstd.F32(), gx.F32(), gw.F32(), gb.F32(), rows, C)
		done()
	} else {
		cpu.LayerNormBackward(g.F64(), x.F64(), w.F64(), mean.F64(), rstd.F64(), gx.F64(), gw.F64(), gb.F64(), rows, C)
	}
	if err := f.l.C.reduceGrads(a, "layernorm.grad", gw, gb); err != nil {
		return nil, err
	}
	return []*tensor.Tensor{gx, gw, gb}, nil
}
