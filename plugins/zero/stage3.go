package zero

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// Stage 3 keeps only each unit's parameter shard. The module hooks gather a
// unit's full parameters into a buffer its tensors are aliased to, for its
// forward and for its backward only:
//
//	PreForward   gather the unit and the units it reads (the head: the
//	             embed unit's tied wte), prefetch the next unit (not in a
//	             forward recomputed in backward)
//	PostForward  release it, unless its backward is next (the last unit, a
//	             forward recomputed in backward)
//	PreBackward  give the unit a gradient buffer, gather it (and the units
//	             it reads) if released, prefetch the unit whose backward is
//	             next; the embed unit's backward reads no parameter
//	             (Unit.Lookup), so it is neither gathered nor prefetched
//	NeedGrad     the head's first contribution to the tied wte's gradient
//	             (its logits matmul computes its input's gradient, the last
//	             read of wte, before its weight's): wte is released, and
//	             the embed unit's gradient buffer, of the same size, takes
//	             its storage from the allocator's free lists; it stays,
//	             with the head's contribution, until the embed unit's
//	             backward adds the embedding's and reduces it
//	PostBackward the head releases the units it read (already released,
//	             unless the head's backward gave wte no gradient)
//	GradReady    when the unit's gradients are final: reduce-scatter them and
//	             release the parameters
//
// So at most two units are gathered at once, beside the head's ln_f (2·C
// elements): two adjacent blocks, the last block and the head, or, during
// the head's backward, the embed unit and the prefetched last block. And
// the tied table's values and its gradient never exist at once: one
// wte-sized buffer serves the embedding's forward, the head's forward and
// backward and the table's gradient in turn, so the heap holds one, in use
// or on the free lists, not two. Stage 2 in float32 uses only the
// PreBackward hook, for the gradient buffers.

// addHooks registers the module hooks of stages 2 and 3.
func (z *Zero) addHooks() {
	for _, u := range z.units {
		h := &u.Module.Hooks
		h.PreBackward = append(h.PreBackward, func(*nn.Module, tensor.PassInfo) { z.keep(z.preBackward(u)) })
		if z.transient() {
			h.PreForward = append(h.PreForward, func(_ *nn.Module, info tensor.PassInfo) { z.keep(z.preForward(u, info)) })
			h.PostForward = append(h.PostForward, func(_ *nn.Module, info tensor.PassInfo) { z.keep(z.postForward(u, info)) })
			if len(u.Uses) > 0 {
				h.PostBackward = append(h.PostBackward, func(*nn.Module, tensor.PassInfo) { z.keep(z.releaseUses(u)) })
			}
			if z.stage == 1 {
				// Stage 1 reduces nothing during backward, so the unit's
				// widened parameters go when its backward is done.
				h.PostBackward = append(h.PostBackward, func(*nn.Module, tensor.PassInfo) { z.keep(z.release(u)) })
			}
		}
	}
}

// PreForward implements trainer.PreForwarder: it reports a failure a module
// hook of the previous pass could not return.
func (z *Zero) PreForward(t *trainer.Trainer, info tensor.PassInfo) error { return z.check() }

// preForward gathers u. A forward run again in backward (full activation
// recomputation) prefetches nothing: the unit whose backward is next was
// prefetched by this unit's successor's PreBackward.
func (z *Zero) preForward(u *unitState, info tensor.PassInfo) error {
	if err := z.gather(u); err != nil {
		return err
	}
	for _, v := range u.Uses {
		if err := z.gather(z.units[v]); err != nil {
			return err
		}
	}
	if next := u.Index + 1; next < len(z.units) && !info.Recompute {
		z.prefetch(z.units[next])
	}
	return nil
}

// postForward releases u after its forward, but not after a forward run
// again in backward: the unit's backward follows at once.
func (z *Zero) postForward(u *unitState, info tensor.PassInfo) error {
	if u.Index == len(z.units)-1 || info.Recompute {
		return nil
	}
	return z.release(u)
}

// releaseUses releases the units u read once u's backward is done.
func (z *Zero) releaseUses(u *unitState) error {
	for _, v := range u.Uses {
		if err := z.release(z.units[v]); err != nil {
			return err
		}
	}
	return nil
}

func (z *Zero) preBackward(u *unitState) error {
	z.ensureGrads(u)
	if !z.transient() {
		// Stage 2 in float32: the units it reads stay gathered, and
		// their gradient buffers are given now, beside them (stage 3
		// gives them in NeedGrad, once their values are released).
		for _, v := range u.Uses {
			z.ensureGrads(z.units[v])
		}
		return nil
	}
	if !u.Lookup {
		if err := z.gather(u); err != nil {
			return err
		}
	}
	for _, v := range u.Uses {
		if err := z.gather(z.units[v]); err != nil {
			return err
		}
	}
	if prev := u.Index - 1; prev >= 0 && !z.units[prev].Lookup {
		z.prefetch(z.units[prev])
	}
	return nil
}

// NeedGrad implements trainer.GradNeeder: an op is about to add the first
// contribution to p's gradient and p's unit has no gradient buffer. That
// is a unit read by another (the tied table, Unit.Uses) in its reader's
// backward; a unit's own backward hook gives it its buffer before. The
// reader asks for the gradient after its last read of the unit's values
// (the head's logits matmul computes its input's gradient first), so the
// gathered values are released before the gradient buffer, of the same
// size, is allocated: it takes their storage from the free lists, and
// the values and the gradient of the table never exist at once.
func (z *Zero) NeedGrad(t *trainer.Trainer, p *tensor.Tensor, info tensor.PassInfo) error {
	u := z.owner[p]
	if u == nil || u.grad != nil || z.stage == 1 {
		return nil
	}
	if z.used[u.Index] && z.transient() {
		if err := z.release(u); err != nil {
			return fmt.Errorf("zero: %w", err)
		}
	}
	z.ensureGrads(u)
	return nil
}

// startGather gives u a full parameter buffer, aliases its parameters into
// it and starts the all-gather of the shards that fills it (under mixed
// precision, startMixed: nil when the buffer is filled already).
func (z *Zero) startGather(u *unitState) *op {
	if z.half != 0 {
		return z.startMixed(u)
	}
	u.flat = z.t.Alloc.NewUninit(tensor.Params, u.shard.DType(), u.Size)
	for _, r := range u.Ranges {
		r.Param.Alias(u.flat, r.Offset)
	}
	flat := u.flat
	return z.issue(u.g, "all_gather "+u.Name, flat.Bytes(), func() comm.Handle { return u.g.AllGatherAsync(u.shard, flat) }, nil)
}

// gather makes u's full parameters available, waiting for a prefetch in
// flight or gathering now.
func (z *Zero) gather(u *unitState) error {
	o := z.gathers[u.Index]
	delete(z.gathers, u.Index)
	if o == nil {
		if u.flat != nil {
			return nil // still gathered
		}
		if err := z.refresh(); err != nil {
			return err
		}
		if o = z.startGather(u); o == nil {
			return nil
		}
	}
	if err := o.wait(); err != nil {
		return fmt.Errorf("all-gather of the parameters of unit %s: %w", u.Name, err)
	}
	return nil
}

// prefetch starts gathering u unless it is gathered or on its way, so the
// transfer overlaps the compute of the unit running now.
func (z *Zero) prefetch(u *unitState) {
	if z.Prefetch && u.flat == nil && z.stage == 3 {
		z.gathers[u.Index] = z.startGather(u)
	}
}

// release drops u's full parameters (the shard stays).
func (z *Zero) release(u *unitState) error {
	if u.flat == nil || !z.transient() {
		return nil
	}
	var err error
	if o := z.gathers[u.Index]; o != nil {
		delete(z.gathers, u.Index)
		err = o.wait()
	}
	for _, r := range u.Ranges {
		r.Param.DropStorage()
	}
	u.flat.Release()
	u.flat = nil
	if u.wire != nil {
		u.wire.Release()
		u.wire = nil
	}
	if err != nil {
		return fmt.Errorf("all-gather of the parameters of unit %s: %w", u.Name, err)
	}
	return nil
}

// releaseAll drops every gathered unit after the optimizer step: their
// copies predate the update.
func (z *Zero) releaseAll() error {
	var first error
	for _, u := range z.units {
		if err := z.release(u); err != nil && first == nil {
			first = fmt.Errorf("zero: %w", err)
		}
	}
	return first
}
