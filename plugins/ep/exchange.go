package ep

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trace"
)

// exchanger is nn.Dispatcher over an expert-parallel group: the per-expert
// counts go with an AllToAll, the token rows with AllToAllV, each rank's
// rows for rank p as one block.
type exchanger struct {
	g     comm.Group
	alloc *tensor.Allocator
	trace *trace.Recorder
	// rows counts the token rows sent to and received from other ranks
	// by the routing (Counts) since the last PostStep.
	rows int64
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
	a := tensor.Default
	if ctx.Backprop != nil {
		a = ctx.Backprop.Alloc()
	}
	gx, err := f.x.run(a, "dispatch.grad", g, f.recv, f.send)
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
