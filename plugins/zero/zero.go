package zero

import (
	"errors"
	"fmt"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/optim"
	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// Zero is the ZeRO plugin of one rank of the data-parallel group.
type Zero struct {
	// Prefetch (stage 3, on by default) starts the all-gather of the next
	// unit when a unit starts, so it overlaps compute. Off, every unit is
	// gathered when it is needed: the simplest form, kept to test against.
	Prefetch bool
	// Reduce is the dtype gradients are reduce-scattered in
	// (ddp.reduce_dtype): Float32, the default, or BFloat16.
	Reduce tensor.DType
	// Held is the group of the ranks holding the same parameters as this
	// one among those held by some data-parallel ranks only (an expert's
	// replicas under expert parallel), and HeldScale the factor applied to
	// their gradient averaged over it. Set, such parameters are sharded
	// over Held like the others over the data-parallel group; nil, they
	// are kept whole (Layout.Whole) and reduced by the plugin that placed
	// them.
	Held      comm.Group
	HeldScale float64

	g     comm.Group
	stage int
	// half is the compute dtype under train.mixed_precision (BFloat16 or
	// Float16) on float32 masters, 0 otherwise: then every stage keeps
	// only its shard of the masters (mixed.go).
	half tensor.DType
	// stale says the 2-byte copies of stages 1 and 2 under mixed precision
	// may predate the masters (an optimizer step, a load through Hold):
	// the next unit gathered refreshes them first.
	stale bool

	t     *trainer.Trainer
	lay   *Layout
	units []*unitState
	opt   *ShardOptimizer
	owner map[*tensor.Tensor]*unitState
	// whole are Layout.Whole: kept and updated whole, reduced elsewhere.
	whole map[*tensor.Tensor]bool

	reduces []*op        // gradient reduce-scatters in flight, oldest first
	gathers map[int]*op  // stage 3: parameter all-gathers in flight, by unit
	reduced int          // units reduce-scattered in the current backward
	used    map[int]bool // the units another unit reads (Unit.Uses)
	err     error        // first failure inside a module hook
}

// unitState is one unit's buffers on this rank.
type unitState struct {
	*Unit
	// g is the group the unit is sharded over (Unit.N ranks), scale the
	// factor applied to its gradient averaged over g (1 but for a Held
	// unit).
	g     comm.Group
	scale float64
	// flat holds the unit's full parameters: permanently in stages 1 and
	// 2 (the model's parameters are aliased into it), only while the unit
	// is gathered in stage 3 and under mixed precision (nil otherwise).
	flat *tensor.Tensor
	// shard is this rank's slice of the parameters: a view of flat in
	// stages 1 and 2, the only permanent copy in stage 3 and under mixed
	// precision (the float32 masters).
	shard *tensor.Tensor
	// copy is the unit's whole 2-byte copy under mixed precision, stages
	// 1 and 2: what its forward and backward read (mixed.go).
	copy *tensor.Tensor
	// wire is stage 3's gathered 2-byte copy under mixed precision, while
	// the unit is gathered.
	wire *tensor.Tensor
	// grad is the unit's full gradient: permanent in stage 1, allocated
	// for the unit's backward only in stages 2 and 3 (nil otherwise).
	grad *tensor.Tensor
	// shardGrad is this rank's slice of the gradient averaged over ranks
	// (and summed over micro-batches): what the optimizer steps with.
	shardGrad *tensor.Tensor
	// pending counts the unit's parameters whose gradient for the current
	// micro-batch is not final yet.
	pending int
}

var (
	_ trainer.Preparer    = (*Zero)(nil)
	_ trainer.LossReducer = (*Zero)(nil)
	_ trainer.Holder      = (*Zero)(nil)
	_ trainer.GradReadier = (*Zero)(nil)
	_ trainer.GradNeeder  = (*Zero)(nil)
	_ trainer.PostGrader  = (*Zero)(nil)
	_ trainer.PreStepper  = (*Zero)(nil)
	_ trainer.PostStepper = (*Zero)(nil)
)

// New returns the ZeRO plugin of the given stage (1, 2 or 3) over the
// data-parallel group g.
func New(g comm.Group, stage int) (*Zero, error) {
	if g == nil {
		return nil, errors.New("zero: no data-parallel group (nil comm.Group)")
	}
	if stage < 1 || stage > 3 {
		return nil, fmt.Errorf("zero: stage %d is not 1, 2 or 3 (set zero.stage; 0 means plain data parallel)", stage)
	}
	return &Zero{g: g, stage: stage, Prefetch: true, gathers: map[int]*op{}}, nil
}

// Name implements trainer.Plugin.
func (z *Zero) Name() string { return fmt.Sprintf("zero%d", z.stage) }

// Stage is the ZeRO stage, 1 to 3.
func (z *Zero) Stage() int { return z.stage }

// Layout is the flat layout of the model's parameters (nil before Prepare).
func (z *Zero) Layout() *Layout { return z.lay }

// Prepare lays the parameters out in flat per-unit buffers, shards what
// the stage shards and replaces the optimizer with one over this rank's
// shard. On a described model (trainer.New) nothing else exists yet: the
// buffers are allocated here, stage 3 allocating its shards only, and the
// trainer fills them through Hold. A model built with its weights
// (NewWith) is copied in and broadcast from rank 0, so every rank starts
// from the same numbers whatever each caller loaded.
func (z *Zero) Prepare(t *trainer.Trainer) error {
	z.t = t
	t.DataRank, t.DataSize = z.g.Rank(), z.g.Size()
	if c := t.Alloc.Compute(); c != tensor.Float32 && t.DType() == tensor.Float32 {
		z.half = c
	}
	hn, hr := 0, 0
	if z.Held != nil {
		hn, hr = z.Held.Size(), z.Held.Rank()
	}
	lay, err := NewLayoutHeld(t.Model, z.g.Size(), z.g.Rank(), hn, hr)
	if err != nil {
		return err
	}
	z.lay = lay
	z.used = map[int]bool{}
	for _, u := range lay.Units {
		for _, v := range u.Uses {
			z.used[v] = true
		}
	}
	z.owner = map[*tensor.Tensor]*unitState{}
	z.whole = map[*tensor.Tensor]bool{}
	for _, p := range lay.Whole {
		z.whole[p] = true
		if !p.HasStorage() {
			p.Allocate() // Hold claims it, so the trainer would not
		}
	}
	for _, u := range lay.Units {
		us := &unitState{Unit: u, g: z.g, scale: 1}
		if u.Held {
			us.g, us.scale = z.Held, z.HeldScale
		}
		if err := z.layOut(us); err != nil {
			return err
		}
		z.units = append(z.units, us)
		for _, r := range u.Ranges {
			z.owner[r.Param] = us
		}
	}
	// An optimizer the caller built holds state for every parameter; it
	// is replaced, so its buffers go back to the allocator.
	if t.Opt != nil {
		for _, s := range t.Opt.State() {
			s.Release()
		}
	}
	z.opt = newShardOptimizer(t.Cfg, lay, z.units, t.Alloc)
	t.Opt = z.opt
	if z.stage >= 2 || z.half != 0 {
		z.addHooks()
	}
	return nil
}

// transient reports whether the model's parameters exist only around
// their unit's forward and backward: in stage 3, and in every stage under
// mixed precision, whose float32 values outside the masters' shard are
// widened from the 2-byte copy for the unit's use only.
func (z *Zero) transient() bool { return z.stage == 3 || z.half != 0 }

// layOut gives u its flat buffers: stages 1 and 2 alias the parameters
// into a full flat buffer, stage 3 keeps only this rank's shard. Values a
// caller built are copied in and broadcast from rank 0; a described
// unit's (no storage) are filled later by the trainer, and stage 3 then
// never holds more than its shard.
func (z *Zero) layOut(u *unitState) error {
	a := z.t.Alloc
	lo := z.lay.Lo(u.Unit)
	described := false
	for _, r := range u.Ranges {
		described = described || !r.Param.HasStorage()
	}
	if z.half != 0 {
		return z.layOutMixed(u, described)
	}
	if described {
		if z.stage <= 2 {
			u.flat = a.New(tensor.Params, z.t.DType(), u.Size)
			u.shard = u.flat.Span(lo, lo+u.Shard)
			for _, r := range u.Ranges {
				r.Param.Alias(u.flat, r.Offset)
			}
		} else {
			u.shard = a.New(tensor.Params, z.t.DType(), u.Shard)
		}
		z.layOutGrads(u)
		return nil
	}
	flat := a.New(tensor.Params, z.t.DType(), u.Size)
	for _, r := range u.Ranges {
		flat.Span(r.Offset, r.Offset+r.Numel).CopyFrom(r.Param)
	}
	err := z.run(u.g, "broadcast "+u.Name, flat.Bytes(), func() comm.Handle { return u.g.BroadcastAsync(flat, 0) })
	if err != nil {
		return fmt.Errorf("zero: broadcast of the initial parameters of unit %s: %w", u.Name, err)
	}
	if z.stage <= 2 {
		u.flat = flat
		u.shard = flat.Span(lo, lo+u.Shard)
		for _, r := range u.Ranges {
			r.Param.Alias(flat, r.Offset)
		}
	} else {
		u.shard = a.New(tensor.Params, flat.DType(), u.Shard)
		u.shard.CopyFrom(flat.Span(lo, lo+u.Shard))
		for _, r := range u.Ranges {
			r.Param.Alias(flat, r.Offset) // releases the parameter's own buffer
			r.Param.DropStorage()
		}
		flat.Release()
	}
	z.layOutGrads(u)
	return nil
}

// layOutGrads gives u its gradient buffers: the full flat gradient in
// stage 1, this rank's shard of it in stages 2 and 3.
func (z *Zero) layOutGrads(u *unitState) {
	a, lo := z.t.Alloc, z.lay.Lo(u.Unit)
	if z.stage == 1 {
		// The full gradient lives all step; this rank's averaged slice is
		// written back into its own range of it (stage12.go), so stage 1
		// holds 4Ψ of gradients, as the formula says, not 4Ψ + 4Ψ/N.
		u.grad = a.New(tensor.Grads, u.shard.DType(), u.Size)
		u.shardGrad = u.grad.Span(lo, lo+u.Shard)
		z.setGradViews(u)
	} else {
		u.shardGrad = a.New(tensor.Grads, u.shard.DType(), u.Shard)
	}
}

// setGradViews points every parameter's Grad at its range of u.grad, so
// backward accumulates straight into the flat buffer the reduce-scatter
// reads.
func (z *Zero) setGradViews(u *unitState) {
	for _, r := range u.Ranges {
		g := u.grad.Span(r.Offset, r.Offset+r.Numel, r.Param.Shape()...)
		g.Name = r.Name
		r.Param.Grad = g
	}
}

// ReduceLoss implements trainer.LossReducer: the mean over ranks.
func (z *Zero) ReduceLoss(t *trainer.Trainer, loss float64) (float64, error) {
	if err := z.check(); err != nil {
		return 0, err
	}
	return t.MeanOver(z.g, loss)
}

// Hold implements trainer.Holder. This rank owns the elements of p that
// fall in its shard of p's unit: their averaged gradient lives in the
// shard gradient (every stage), and in stage 3 their value lives only in
// the parameter shard. Both are described as a Flat range of p along the
// data-parallel axis; in stages 1 and 2 the value stays the whole tensor,
// replicated over the group. A Held unit's parameter (an expert) is Flat
// along dp too: only its holders have it, their ranges are disjoint and
// cover it, so each element is still counted once.
func (z *Zero) Hold(t *trainer.Trainer, p *tensor.Tensor) (trainer.Holding, bool) {
	if z.whole[p] {
		h := trainer.Holding{Value: trainer.Part{Spec: p.Spec, Data: p}, Grad: trainer.Part{Spec: p.Spec, Data: p.Grad}}
		h.Opt, _ = z.opt.inner.(optim.PerParam)
		h.OptParam = p
		return h, true
	}
	u := z.owner[p]
	if u == nil {
		return trainer.Holding{}, false
	}
	r := z.lay.Range(p)
	lo := z.lay.Lo(u.Unit)
	a, b := max(lo, r.Offset), min(lo+u.Shard, r.Offset+r.Numel)
	flat := p.Spec.Clone()
	flat.Along[place.DP] = place.Placement{Kind: place.Flat, Offset: max(0, a-r.Offset), Length: max(0, b-a)}
	h := trainer.Holding{Value: trainer.Part{Spec: p.Spec, Data: p}, Grad: trainer.Part{Spec: flat}}
	if a < b {
		h.Grad.Data = u.shardGrad.Span(a-lo, b-lo)
		h.Opt, _ = z.opt.inner.(optim.PerParam)
		h.OptParam = z.opt.viewOf[p]
	}
	if z.transient() {
		h.Value = trainer.Part{Spec: flat}
		if a < b {
			h.Value.Data = u.shard.Span(a-lo, b-lo)
		}
		// The caller may write the masters (a load): the copies follow
		// them before the next use.
		z.stale = z.half != 0
	}
	return h, true
}

// PostStep implements trainer.PostStepper: stages 1 and 2 all-gather the
// updated shards into every rank's full parameters; stage 3 keeps only the
// shards, which the optimizer updated in place.
func (z *Zero) PostStep(t *trainer.Trainer, m *trainer.StepMetrics) error {
	if z.transient() {
		// Under mixed precision stages 1 and 2 gather the updated masters'
		// 2-byte copies before the next unit is used (mixed.go).
		z.stale = z.half != 0
		return z.releaseAll()
	}
	ops := make([]*op, len(z.units))
	for i, u := range z.units {
		ops[i] = z.issue(u.g, "all_gather "+u.Name, u.flat.Bytes(), func() comm.Handle { return u.g.AllGatherAsync(u.shard, u.flat) }, nil)
	}
	for i, o := range ops {
		if err := o.wait(); err != nil {
			return fmt.Errorf("zero: all-gather of the updated parameters of unit %s: %w", z.units[i].Name, err)
		}
	}
	return nil
}

// check returns the first error a module hook could not return itself.
func (z *Zero) check() error {
	if z.err != nil {
		return fmt.Errorf("zero: %w", z.err)
	}
	return nil
}
