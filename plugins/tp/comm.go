package tp

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
	"github.com/tinyacc/tinyacc/core/trace"
)

// Comm is the tensor-parallel group as the layers see it: the group, the
// rank's allocator (every buffer of the ops below is accounted there) and
// its trace (each collective is a span on the comm track).
//
// Its methods are the communication ops of tensor parallelism, each an
// autograd op (tensor.Apply) whose backward is its conjugate:
//
//	Copy        f: identity forward, all-reduce of the gradient backward
//	Reduce      g: all-reduce forward, identity backward
//	GatherSeq   all-gather along the sequence forward, reduce-scatter backward
//	ScatterSeq  reduce-scatter along the sequence forward, all-gather backward
//	GatherLast  all-gather along the last dimension forward (uneven parts
//	            allowed), this rank's columns of the gradient backward
//
// Sequence ops take [B, T, C] tensors whose rows of the sequence are split
// into equal consecutive parts: rank r holds positions [r·T/N, (r+1)·T/N)
// of every sequence of the batch.
type Comm struct {
	G     comm.Group
	Alloc *tensor.Allocator // nil: tensor.Default
	Trace *trace.Recorder   // nil: no spans
}

func (c *Comm) alloc() *tensor.Allocator {
	if c.Alloc == nil {
		return tensor.Default
	}
	return c.Alloc
}

// run performs one blocking collective under a trace span.
func (c *Comm) run(what string, bytes int64, f func() error) error {
	span := c.Trace.Begin(what+" tp", "comm", trace.Comm).With("bytes", bytes).With("group", c.G.Name())
	err := f()
	span.End()
	if err != nil {
		return fmt.Errorf("tp: %s over group %s: %w", what, c.G.Name(), err)
	}
	return nil
}

// allReduce sums t over the group, in place.
func (c *Comm) allReduce(what string, t *tensor.Tensor) error {
	return c.run("all_reduce "+what, t.Bytes(), func() error { return c.G.AllReduce(t, comm.Sum) })
}

// act is the dtype activations and their gradients travel in: the rank's
// compute dtype, bf16 or fp16 under mixed precision (half the bytes;
// comm.AllReduceAs and its kin), else their own. Parameter gradients and
// the cross-entropy's statistics stay float32.
func (c *Comm) act() tensor.DType { return c.alloc().Compute() }

// wireBytes is what a float32 buffer of t's size weighs in dtype d.
func wireBytes(t *tensor.Tensor, d tensor.DType) int64 {
	if t.DType() != tensor.Float32 {
		return t.Bytes()
	}
	return int64(t.Numel()) * int64(d.Size())
}

// allReduceAct sums the activation (or activation gradient) t over the
// group in place, carried in the compute dtype.
func (c *Comm) allReduceAct(what string, t *tensor.Tensor) error {
	d := c.act()
	return c.run("all_reduce "+what, wireBytes(t, d), func() error { return comm.AllReduceAs(c.G, t, comm.Sum, d) })
}

// backAlloc is the allocator of a backward pass.
func backAlloc(ctx *tensor.FuncCtx) *tensor.Allocator {
	if ctx.Backprop != nil {
		return ctx.Backprop.Alloc()
	}
	return tensor.Default
}

// Copy is f: x itself forward (a view, nothing is copied), the sum over
// the group of the gradient backward. It enters a region where each rank
// computes a different part from the same replicated input (a
// column-parallel layer), whose input gradient is the sum of the parts'.
func (c *Comm) Copy(x *tensor.Tensor) (*tensor.Tensor, error) {
	return tensor.Apply("tp.copy", &copyFn{c}, x)
}

type copyFn struct{ c *Comm }

func (f *copyFn) Forward(_ *tensor.FuncCtx, in ...*tensor.Tensor) (*tensor.Tensor, error) {
	return in[0].Reshape(in[0].Shape()...), nil
}

// Backward sums the gradient in place: the buffer is this op's own.
func (f *copyFn) Backward(_ *tensor.FuncCtx, g *tensor.Tensor) ([]*tensor.Tensor, error) {
	if err := f.c.allReduceAct("copy.grad", g); err != nil {
		return nil, err
	}
	return []*tensor.Tensor{g}, nil
}

// Reduce is g: the sum over the group forward, the gradient unchanged
// backward. It leaves a region whose ranks hold partial sums (a
// row-parallel layer's products) for a replicated one.
func (c *Comm) Reduce(x *tensor.Tensor) (*tensor.Tensor, error) {
	return tensor.Apply("tp.reduce", &reduceFn{c: c}, x)
}

// reduceFn with inPlace sums x where it lies and returns a view of it: for
// an x that is the private output of the op just before and that no
// backward reads (a Linear's output), which saves a buffer per layer.
type reduceFn struct {
	c       *Comm
	inPlace bool
}

func (f *reduceFn) Forward(_ *tensor.FuncCtx, in ...*tensor.Tensor) (*tensor.Tensor, error) {
	x := in[0]
	out := x.Reshape(x.Shape()...)
	if !f.inPlace {
		out = f.c.alloc().NewUninit(tensor.Activations, x.DType(), x.Shape()...)
		out.CopyFrom(x)
	}
	if err := f.c.allReduceAct("reduce", out); err != nil {
		if !f.inPlace {
			out.Release()
		}
		return nil, err
	}
	return out, nil
}

func (f *reduceFn) Backward(_ *tensor.FuncCtx, g *tensor.Tensor) ([]*tensor.Tensor, error) {
	return []*tensor.Tensor{g}, nil
}

// seqDims checks x is [B, T, C] and returns its sizes.
func seqDims(op string, x *tensor.Tensor) (B, T, C int, err error) {
	s := x.Shape()
	if len(s) != 3 {
		return 0, 0, 0, fmt.Errorf("tp: %s needs a [B, T, C] tensor, got %v", op, s)
	}
	return s[0], s[1], s[2], nil
}

// GatherSeq all-gathers x [B, T/N, C], this rank's part of the sequence,
// into [B, T, C] on every rank; backward reduce-scatters the gradient
// (every rank's full-sequence gradient is a partial sum) back to this
// rank's part. It enters a column-parallel layer under sequence
// parallelism.
func (c *Comm) GatherSeq(x *tensor.Tensor) (*tensor.Tensor, error) {
	return tensor.Apply("tp.gather_seq", &gatherSeqFn{c}, x)
}

type gatherSeqFn struct{ c *Comm }

func (f *gatherSeqFn) Forward(_ *tensor.FuncCtx, in ...*tensor.Tensor) (*tensor.Tensor, error) {
	return f.c.gatherSeq(f.c.alloc(), in[0], "gather_seq")
}

func (f *gatherSeqFn) Backward(ctx *tensor.FuncCtx, g *tensor.Tensor) ([]*tensor.Tensor, error) {
	gx, err := f.c.scatterSeq(backAlloc(ctx), g, "gather_seq.grad")
	return []*tensor.Tensor{gx}, err
}

// ScatterSeq sums x [B, T, C] over the group and leaves this rank its part
// of the sequence, [B, T/N, C]; backward all-gathers the gradient. It
// leaves a row-parallel layer under sequence parallelism.
func (c *Comm) ScatterSeq(x *tensor.Tensor) (*tensor.Tensor, error) {
	return tensor.Apply("tp.scatter_seq", &scatterSeqFn{c: c}, x)
}

// scatterSeqFn with consume releases x once it is sent: for an x that is
// the private output of the op before and that no backward reads (a
// Linear's output, the embedding's masked lookup), so the full-sequence
// buffer does not live until backward.
type scatterSeqFn struct {
	c       *Comm
	consume bool
}

func (f *scatterSeqFn) Forward(_ *tensor.FuncCtx, in ...*tensor.Tensor) (*tensor.Tensor, error) {
	out, err := f.c.scatterSeq(f.c.alloc(), in[0], "scatter_seq")
	if err == nil && f.consume {
		in[0].Release()
	}
	return out, err
}

func (f *scatterSeqFn) Backward(ctx *tensor.FuncCtx, g *tensor.Tensor) ([]*tensor.Tensor, error) {
	gx, err := f.c.gatherSeq(backAlloc(ctx), g, "scatter_seq.grad")
	return []*tensor.Tensor{gx}, err
}

// gatherSeq all-gathers x [B, Tl, C] into a new [B, N·Tl, C].
func (c *Comm) gatherSeq(a *tensor.Allocator, x *tensor.Tensor, what string) (*tensor.Tensor, error) {
	B, Tl, C, err := seqDims(what, x)
	if err != nil {
		return nil, err
	}
	n := c.G.Size()
	raw := a.NewUninit(tensor.Comm, x.DType(), n*x.Numel()) // [N, B, Tl, C]
	defer raw.Release()
	d := c.act()
	if err := c.run("all_gather "+what, wireBytes(raw, d), func() error { return comm.AllGatherAs(c.G, x, raw, d) }); err != nil {
		return nil, err
	}
	out := a.NewUninit(tensor.Activations, x.DType(), B, n*Tl, C)
	permute(raw, out, n, B, Tl*C, false)
	return out, nil
}

// scatterSeq reduce-scatters x [B, T, C] into a new [B, T/N, C].
func (c *Comm) scatterSeq(a *tensor.Allocator, x *tensor.Tensor, what string) (*tensor.Tensor, error) {
	B, T, C, err := seqDims(what, x)
	if err != nil {
		return nil, err
	}
	n := c.G.Size()
	if T%n != 0 {
		return nil, fmt.Errorf("tp: %s: a sequence of %d rows does not split over %d ranks (sequence parallel needs T %% tp == 0)", what, T, n)
	}
	Tl := T / n
	raw := a.NewUninit(tensor.Comm, x.DType(), x.Numel()) // [N, B, Tl, C]
	defer raw.Release()
	permute(raw, x, n, B, Tl*C, true)
	out := a.NewUninit(tensor.Activations, x.DType(), B, Tl, C)
	d := c.act()
	err = c.run("reduce_scatter "+what, wireBytes(raw, d), func() error { return comm.ReduceScatterAs(c.G, raw, out, comm.Sum, d) })
	if err != nil {
		out.Release()
		return nil, err
	}
	return out, nil
}

// permute moves blocks of k elements between the rank-major layout
// [N, B, k] of a collective's buffer and the batch-major [B, N, k] of the
// activations: toRaw copies seq into raw, else raw into seq.
func permute(raw, seq *tensor.Tensor, n, B, k int, toRaw bool) {
	for r := 0; r < n; r++ {
		for b := 0; b < B; b++ {
			ro, so := (r*B+b)*k, (b*n+r)*k
			switch raw.DType() {
			case tensor.Float32:
				if toRaw {
					copy(raw.F32()[ro:ro+k], seq.F32()[so:so+k])
				} else {
					copy(seq.F32()[so:so+k], raw.F32()[ro:ro+k])
				}
			default:
				if toRaw {
					copy(raw.F64()[ro:ro+k], seq.F64()[so:so+k])
				} else {
					copy(seq.F64()[so:so+k], raw.F64()[ro:ro+k])
				}
			}
		}
	}
}

// GatherLast all-gathers x [..., w_r] along its last dimension, where rank
// r holds widths[r] columns, into [..., Σ widths] on every rank, ranks'
// columns in rank order. Backward hands this rank its columns of the
// gradient: what follows must compute the same on every rank (full logits
// for sampling; a column-parallel layer's output gathered, as the naive
// form of tensor parallel does).
func (c *Comm) GatherLast(x *tensor.Tensor, widths []int) (*tensor.Tensor, error) {
	if len(widths) != c.G.Size() || widths[c.G.Rank()] != x.Dim(-1) {
		return nil, fmt.Errorf("tp: gather_last of %v with widths %v over %d ranks", x.Shape(), widths, c.G.Size())
	}
	return tensor.Apply("tp.gather_last", &gatherLastFn{c: c, widths: widths}, x)
}

type gatherLastFn struct {
	c      *Comm
	widths []int
}

func (f *gatherLastFn) Forward(_ *tensor.FuncCtx, in ...*tensor.Tensor) (*tensor.Tensor, error) {
	x := in[0]
	a := f.c.alloc()
	w := x.Dim(-1)
	rows := x.Numel() / max(1, w)
	total := 0
	counts := make([]int, len(f.widths))
	for r, wr := range f.widths {
		counts[r] = rows * wr
		total += wr
	}
	raw := a.NewUninit(tensor.Comm, x.DType(), rows*total)
	defer raw.Release()
	if err := f.c.run("all_gather gather_last", raw.Bytes(), func() error { return f.c.G.AllGatherV(x, raw, counts) }); err != nil {
		return nil, err
	}
	shape := append(append([]int(nil), x.Shape()[:len(x.Shape())-1]...), total)
	out := a.NewUninit(tensor.Activations, x.DType(), shape...)
	at, col := 0, 0
	for _, wr := range f.widths {
		for i := 0; i < rows; i++ {
			copyRange(out, i*total+col, raw, at+i*wr, wr)
		}
		at += rows * wr
		col += wr
	}
	return out, nil
}

func (f *gatherLastFn) Backward(ctx *tensor.FuncCtx, g *tensor.Tensor) ([]*tensor.Tensor, error) {
	total := g.Dim(-1)
	rows := g.Numel() / max(1, total)
	me := f.c.G.Rank()
	col := 0
	for r := 0; r < me; r++ {
		col += f.widths[r]
	}
	w := f.widths[me]
	shape := append(append([]int(nil), g.Shape()[:len(g.Shape())-1]...), w)
	gx := backAlloc(ctx).NewUninit(tensor.Activations, g.DType(), shape...)
	for i := 0; i < rows; i++ {
		copyRange(gx, i*w, g, i*total+col, w)
	}
	return []*tensor.Tensor{gx}, nil
}

// copyRange copies n elements of src from so into dst at do.
func copyRange(dst *tensor.Tensor, do int, src *tensor.Tensor, so, n int) {
	if dst.DType() == tensor.Float32 {
		copy(dst.F32()[do:do+n], src.F32()[so:so+n])
	} else {
		copy(dst.F64()[do:do+n], src.F64()[so:so+n])
	}
}

// reduceGrads sums the gradients gs (each a partial sum: a replicated
// parameter used on this rank's part of the sequence) over the group with
// one all-reduce, in place.
func (c *Comm) reduceGrads(a *tensor.Allocator, what string, gs ...*tensor.Tensor) error {
	if len(gs) == 1 {
		return c.allReduce(what, gs[0])
	}
	n := 0
	for _, g := range gs {
		n += g.Numel()
	}
	buf := a.NewUninit(tensor.Comm, gs[0].DType(), n)
	defer buf.Release()
	at := 0
	for _, g := range gs {
		copyRange(buf, at, g, 0, g.Numel())
		at += g.Numel()
	}
	if err := c.allReduce(what, buf); err != nil {
		return err
	}
	at = 0
	for _, g := range gs {
		copyRange(g, 0, buf, at, g.Numel())
		at += g.Numel()
	}
	return nil
}

// floats dispatches on a float tensor's element type.
func floats[T cpu.Float](t *tensor.Tensor) []T {
	var z T
	if _, ok := any(z).(float32); ok {
		return any(t.F32()).([]T)
	}
	return any(t.F64()).([]T)
}
