package ep

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trace"
)

// exchanger is nn.Dispatcher over an expert-parallel group: the per-expert
// counts go with an AllToAll, the token rows with AllToAllV, each rank's
// rows for rank p as one block. Its naive form (gather) all-gathers every
// rank's rows and reduce-scatters the outputs instead.
type exchanger struct {
	g     comm.Group
	alloc *tensor.Allocator
	trace *trace.Recorder
	// rows counts the token rows sent to and received from other ranks
	// by the routing (Counts) since the last PostStep.
	rows int64
	// gather picks the naive form (ep.dispatch allgather).
	gather bool
}

func (x *exchanger) Size() int { return x.g.Size() }
func (x *exchanger) Rank() int { return x.g.Rank() }

// Counts implements nn.Dispatcher: count is in expert order, so block p
// (rank p's experts) goes to rank p.
func (x *exchanger) Counts(count []int) ([]int, error) {
	in := make([]float64, len(count))
	for i, n := range count {
		in[i] = float64(n)
	}
	src, dst := tensor.FromF64(in, len(in)), tensor.FromF64(make([]float64, len(in)), len(in))
	span := x.trace.Begin("all_to_all moe counts", "comm", trace.Comm).With("bytes", src.Bytes()).With("group", x.g.Name())
	err := x.g.AllToAll(src, dst)
	span.End()
	if err != nil {
		return nil, fmt.Errorf("ep: all-to-all of expert counts over group %s: %w", x.g.Name(), err)
	}
	out := make([]int, len(count))
	L, me := len(count)/x.g.Size(), x.g.Rank()
	for i, v := range dst.F64() {
		out[i] = int(v)
		if i/L != me {
			x.rows += int64(count[i] + out[i])
		}
	}
	return out, nil
}

// Exchange implements nn.Dispatcher.
func (x *exchanger) Exchange(rows *tensor.Tensor, send, recv []int) (*tensor.Tensor, error) {
	return tensor.Apply("ep.all_to_all", &exchangeFn{x: x, send: send, recv: recv}, rows)
}

// exchangeFn sends send[p] rows to rank p and receives recv[q] rows from
// rank q; its backward sends the gradient rows back the same way
// reversed.
type exchangeFn struct {
	x          *exchanger
	send, recv []int
}

func (f *exchangeFn) Forward(_ *tensor.FuncCtx, in ...*tensor.Tensor) (*tensor.Tensor, error) {
	return f.x.run(f.x.alloc, "dispatch", in[0], f.send, f.recv)
}

func (f *exchangeFn) Backward(ctx *tensor.FuncCtx, g *tensor.Tensor) ([]*tensor.Tensor, error) {
	gx, err := f.x.run(backAlloc(ctx), "dispatch.grad", g, f.recv, f.send)
	if err != nil {
		return nil, err
	}
	return []*tensor.Tensor{gx}, nil
}

// run moves rows [S, C] (S = Σ send) into a new [Σ recv, C] tensor.
func (x *exchanger) run(a *tensor.Allocator, what string, rows *tensor.Tensor, send, recv []int) (*tensor.Tensor, error) {
	C := rows.Dim(-1)
	sc, rc := make([]int, len(send)), make([]int, len(recv))
	total := 0
	for p := range send {
		sc[p], rc[p] = send[p]*C, recv[p]*C
		total += recv[p]
	}
	out := a.NewUninit(tensor.Activations, rows.DType(), total, C)
	span := x.trace.Begin("all_to_all "+what, "comm", trace.Comm).With("bytes", rows.Bytes()).With("group", x.g.Name())
	err := x.g.AllToAllV(rows, out, sc, rc)
	span.End()
	if err != nil {
		out.Release()
		return nil, fmt.Errorf("ep: all-to-all %s over group %s: %w", what, x.g.Name(), err)
	}
	return out, nil
}

// Gathers implements nn.Dispatcher: true for ep.dispatch allgather.
func (x *exchanger) Gathers() bool { return x.gather }

// GatherRows implements nn.Dispatcher.
func (x *exchanger) GatherRows(rows *tensor.Tensor) (*tensor.Tensor, error) {
	return tensor.Apply("ep.all_gather", &gatherFn{x: x}, rows)
}

// ScatterSum implements nn.Dispatcher.
func (x *exchanger) ScatterSum(y *tensor.Tensor) (*tensor.Tensor, error) {
	return tensor.Apply("ep.reduce_scatter", &scatterFn{x: x}, y)
}

// GatherInts implements nn.Dispatcher (as float64, exact for counts and
// expert indices).
func (x *exchanger) GatherInts(v []int) ([]int, error) {
	in := make([]float64, len(v))
	for i, n := range v {
		in[i] = float64(n)
	}
	out := tensor.FromF64(make([]float64, len(v)*x.g.Size()), len(v)*x.g.Size())
	if err := x.g.AllGather(tensor.FromF64(in, len(in)), out); err != nil {
		return nil, fmt.Errorf("ep: all-gather of expert choices over group %s: %w", x.g.Name(), err)
	}
	res := make([]int, out.Numel())
	for i, f := range out.F64() {
		res[i] = int(f)
	}
	return res, nil
}

// gatherFn all-gathers rows [N, W] into [P·N, W]; backward reduce-scatters.
type gatherFn struct{ x *exchanger }

func (f *gatherFn) Forward(_ *tensor.FuncCtx, in ...*tensor.Tensor) (*tensor.Tensor, error) {
	r := in[0]
	out := f.x.alloc.NewUninit(tensor.Activations, r.DType(), f.x.g.Size()*r.Dim(0), r.Dim(-1))
	if err := f.x.collective("all_gather", r.Bytes(), func() error { return f.x.g.AllGather(r, out) }); err != nil {
		out.Release()
		return nil, err
	}
	return out, nil
}

func (f *gatherFn) Backward(ctx *tensor.FuncCtx, g *tensor.Tensor) ([]*tensor.Tensor, error) {
	gx := backAlloc(ctx).NewUninit(tensor.Activations, g.DType(), g.Dim(0)/f.x.g.Size(), g.Dim(-1))
	if err := f.x.collective("reduce_scatter grad", g.Bytes(), func() error { return f.x.g.ReduceScatter(g, gx, comm.Sum) }); err != nil {
		return nil, err
	}
	return []*tensor.Tensor{gx}, nil
}

// scatterFn reduce-scatters y [P·N, C] into [N, C]; backward all-gathers.
type scatterFn struct{ x *exchanger }

func (f *scatterFn) Forward(_ *tensor.FuncCtx, in ...*tensor.Tensor) (*tensor.Tensor, error) {
	y := in[0]
	out := f.x.alloc.NewUninit(tensor.Activations, y.DType(), y.Dim(0)/f.x.g.Size(), y.Dim(-1))
	if err := f.x.collective("reduce_scatter", y.Bytes(), func() error { return f.x.g.ReduceScatter(y, out, comm.Sum) }); err != nil {
		out.Release()
		return nil, err
	}
	return out, nil
}

func (f *scatterFn) Backward(ctx *tensor.FuncCtx, g *tensor.Tensor) ([]*tensor.Tensor, error) {
	gy := backAlloc(ctx).NewUninit(tensor.Activations, g.DType(), g.Dim(0)*f.x.g.Size(), g.Dim(-1))
	if err := f.x.collective("all_gather grad", g.Bytes(), func() error { return f.x.g.AllGather(g, gy) }); err != nil {
		return nil, err
	}
	return []*tensor.Tensor{gy}, nil
}

// collective runs one blocking collective of the group under a trace span.
func (x *exchanger) collective(what string, bytes int64, f func() error) error {
	span := x.trace.Begin(what+" ep", "comm", trace.Comm).With("bytes", bytes).With("group", x.g.Name())
	err := f()
	span.End()
	if err != nil {
		return fmt.Errorf("ep: %s over group %s: %w", what, x.g.Name(), err)
	}
	return nil
}

func backAlloc(ctx *tensor.FuncCtx) *tensor.Allocator {
	if ctx.Backprop != nil {
		return ctx.Backprop.Alloc()
	}
	return tensor.Default
}
