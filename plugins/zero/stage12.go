package zero

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// The gradient path. Stage 1 keeps full gradients and reduce-scatters them
// once per step, after the last micro-batch (PreStep). Stages 2 and 3 keep
// only the shard: each unit's full gradient buffer exists for the unit's
// backward only, and is reduce-scattered (Avg) into the shard gradient the
// moment its last parameter's gradient is final, every micro-batch, while
// backward goes on with earlier units.

// PreStep implements trainer.PreStepper.
func (z *Zero) PreStep(t *trainer.Trainer) error {
	if err := z.check(); err != nil {
		return err
	}
	if z.stage != 1 {
		return nil // reduced during backward, waited for in PostGrad
	}
	// A reduce-scatter may not write into its own input, so the averaged
	// slice lands in a comm buffer and is copied into this rank's range of
	// the full gradient (which is what the optimizer's views point at).
	ops := make([]*op, len(z.units))
	for i, u := range z.units {
		tmp := z.t.Alloc.NewUninit(tensor.Comm, u.shardGrad.DType(), u.Shard)
		ops[i] = z.reduceScatter(u, "reduce_scatter "+u.Name, u.grad, tmp, func() {
			u.shardGrad.CopyFrom(tmp)
			tmp.Release()
		})
	}
	for i, o := range ops {
		if err := o.wait(); err != nil {
			return fmt.Errorf("zero: reduce-scatter of the gradients of unit %s: %w", z.units[i].Name, err)
		}
	}
	return nil
}

// GradReady implements trainer.GradReadier: in stages 2 and 3 a unit whose
// parameters all have their final gradient is reduce-scattered at once.
func (z *Zero) GradReady(t *trainer.Trainer, p *tensor.Tensor, info tensor.PassInfo) error {
	if z.stage == 1 {
		return nil
	}
	u := z.owner[p]
	if u == nil && z.whole[p] {
		return nil // reduced over its replicas by the plugin that placed it
	}
	if u == nil {
		return fmt.Errorf("zero: gradient of %s, which is in no unit of the layout (was the model changed after Prepare?)", p.Name)
	}
	if u.grad == nil {
		return fmt.Errorf("zero: gradient of %s arrived before unit %s's backward hook gave it a buffer (is a module hook missing?)", p.Name, u.Name)
	}
	u.pending--
	if u.pending > 0 {
		return nil
	}
	return z.reduceUnit(u, info)
}

// ensureGrads gives u a zeroed full gradient buffer for the coming backward
// and points its parameters' Grad at it (backward accumulates into a Grad
// that is already set).
func (z *Zero) ensureGrads(u *unitState) {
	if u.grad != nil {
		return
	}
	u.grad = z.t.Alloc.New(tensor.Grads, z.t.DType(), u.Size)
	u.pending = len(u.Ranges)
	z.setGradViews(u)
}

// reduceUnit starts the reduce-scatter of u's full gradient into its shard
// gradient. The first micro-batch writes the shard directly; later ones go
// through a comm buffer and are added, since the shard holds the earlier
// micro-batches' sum. The full buffer is released once the collective is
// done; at most one reduce-scatter stays in flight, so at most two units'
// full gradients (plus a shared unit's) exist at once.
func (z *Zero) reduceUnit(u *unitState, info tensor.PassInfo) error {
	grad, out := u.grad, u.shardGrad
	var tmp *tensor.Tensor
	if info.Micro > 0 {
		tmp = z.t.Alloc.NewUninit(tensor.Comm, out.DType(), u.Shard)
		out = tmp
	}
	shardGrad := u.shardGrad
	o := z.reduceScatter(u, "reduce_scatter "+u.Name, grad, out, func() {
		if tmp != nil {
			if shardGrad.DType() == tensor.Float32 {
				cpu.Add(shardGrad.F32(), tmp.F32(), shardGrad.F32())
			} else {
				cpu.Add(shardGrad.F64(), tmp.F64(), shardGrad.F64())
			}
			tmp.Release()
		}
		grad.Release()
	})
	// Nothing accumulates into this unit again in this micro-batch; the
	// views must not outlive the buffer (the trainer zeroes every Grad).
	for _, r := range u.Ranges {
		r.Param.Grad = nil
	}
	u.grad = nil
	z.reduced++
	z.reduces = append(z.reduces, o)
	if z.transient() {
		z.release(u) // its backward is done: the gathered parameters can go
	}
	if err := z.waitReduces(1); err != nil {
		return fmt.Errorf("zero: reduce-scatter of gradients: %w", err)
	}
	return nil
}

// PostGrad implements trainer.PostGrader: in stages 2 and 3 it finishes the
// micro-batch's reduce-scatters and checks that every unit was reduced.
func (z *Zero) PostGrad(t *trainer.Trainer, info tensor.PassInfo) error {
	if z.stage == 1 {
		return z.check()
	}
	if err := z.waitReduces(0); err != nil {
		return fmt.Errorf("zero: reduce-scatter of gradients: %w", err)
	}
	if err := z.check(); err != nil {
		return err
	}
	for _, u := range z.units {
		if u.grad != nil {
			return fmt.Errorf("zero: after the backward of micro-batch %d, %d of unit %s's %d parameters have no final gradient; ZeRO needs a gradient for every parameter",
				info.Micro, u.pending, u.Name, len(u.Ranges))
		}
	}
	if n := z.reduced; n != len(z.units) {
		z.reduced = 0
		return fmt.Errorf("zero: the backward of micro-batch %d reduced %d of %d units; a unit whose backward hook never ran got no gradient", info.Micro, n, len(z.units))
	}
	z.reduced = 0
	return nil
}
