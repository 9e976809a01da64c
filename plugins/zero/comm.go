package zero

import (
	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
	"github.com/tinyacc/tinyacc/core/trace"
)

// op is a collective in flight. Its trace span runs from issue to the
// moment Wait returns, so the trace shows how long communication really
// took and how much of it hid behind compute.
type op struct {
	h    comm.Handle
	span trace.Span
	// then runs once after a successful wait: accumulate a received shard,
	// release the buffers the collective read.
	then func()
	done bool
	err  error
}

// issue starts a collective with a span named name carrying its size in
// bytes (the full buffer, as bus-bandwidth reports count it).
func (z *Zero) issue(g comm.Group, name string, bytes int64, start func() comm.Handle, then func()) *op {
	span := z.t.Trace.Begin(name, "comm", trace.Comm).With("bytes", bytes).With("group", g.Name())
	return &op{h: start(), span: span, then: then}
}

// reduceScatter issues the averaging reduce-scatter of u's full gradient
// over u's group into out, scales it by u's factor (a Held unit's) and
// then runs then. With Reduce = BFloat16 (ddp.reduce_dtype
// bf16) and float32 gradients, full is rounded to bf16 first, the shard
// arrives in bf16 (summed in float32 and rounded once, comm/half.go) and is
// widened into out: half the bytes on the wire.
func (z *Zero) reduceScatter(u *unitState, name string, full, out *tensor.Tensor, then func()) *op {
	scaled := func() {
		if u.scale != 1 && out.DType() == tensor.Float32 {
			cpu.Scale(out.F32(), float32(u.scale))
		} else if u.scale != 1 {
			cpu.Scale(out.F64(), u.scale)
		}
		if then != nil {
			then()
		}
	}
	if z.Reduce != tensor.BFloat16 || full.DType() != tensor.Float32 {
		return z.issue(u.g, name, full.Bytes(), func() comm.Handle {
			return u.g.ReduceScatterAsync(full, out, comm.Avg)
		}, scaled)
	}
	wire := z.t.Alloc.NewUninit(tensor.Comm, tensor.BFloat16, full.Numel())
	cpu.BF16FromF32s(wire.U16(), full.F32())
	shard := z.t.Alloc.NewUninit(tensor.Comm, tensor.BFloat16, out.Numel())
	return z.issue(u.g, name, wire.Bytes(), func() comm.Handle {
		return u.g.ReduceScatterAsync(wire, shard, comm.Avg)
	}, func() {
		cpu.BF16ToF32s(out.F32(), shard.U16())
		wire.Release()
		shard.Release()
		scaled()
	})
}

// wait blocks until the collective is done; later calls return the same
// result.
func (o *op) wait() error {
	if o.done {
		return o.err
	}
	o.done = true
	o.err = o.h.Wait()
	o.span.End()
	if o.err == nil && o.then != nil {
		o.then()
	}
	return o.err
}

// run issues a collective and waits for it.
func (z *Zero) run(g comm.Group, name string, bytes int64, start func() comm.Handle) error {
	return z.issue(g, name, bytes, start, nil).wait()
}

// keep records the first error seen where it cannot be returned (module
// hooks); the next hook that can return an error reports it.
func (z *Zero) keep(err error) {
	if err != nil && z.err == nil {
		z.err = err
	}
}

// waitReduces finishes the reduce-scatters in flight, oldest first, until
// at most keepN are left.
func (z *Zero) waitReduces(keepN int) error {
	for len(z.reduces) > keepN {
		o := z.reduces[0]
		z.reduces = z.reduces[1:]
		if err := o.wait(); err != nil {
			return err
		}
	}
	return nil
}
