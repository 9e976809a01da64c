package zero

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/optim"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// View is one optimizer parameter: the piece of a model parameter that lies
// in this rank's shard.
type View struct {
	Param *tensor.Tensor // the 1-D view the optimizer updates; Grad set
	Piece Piece
	Unit  string
}

// ShardOptimizer is the optimizer of a ZeRO rank: the configured optimizer
// over views of the owned shard only, so its state is 1/N of the model's.
// Its Params are the views, whose Grad are views of the shard gradients:
// the trainer's clipping scales exactly the numbers the step uses.
type ShardOptimizer struct {
	inner  optim.Optimizer
	views  []View
	viewOf map[*tensor.Tensor]*tensor.Tensor // model parameter -> its view
}

// newShardOptimizer builds the optimizer of cfg over per-parameter views of
// every unit's shard. Each view takes its weight decay from the parameter
// it belongs to (decay for tensors of two or more dimensions), so the
// update matches the unsharded optimizer element for element.
func newShardOptimizer(cfg config.Config, lay *Layout, units []*unitState, alloc *tensor.Allocator) *ShardOptimizer {
	o := &ShardOptimizer{viewOf: map[*tensor.Tensor]*tensor.Tensor{}}
	var decay, none []*tensor.Tensor
	for _, u := range units {
		for _, pc := range lay.Pieces(u.Unit) {
			n := pc.Hi - pc.Lo
			p := u.shard.Span(pc.At, pc.At+n).RequiresGrad()
			p.Name = pc.ViewName()
			p.Grad = u.shardGrad.Span(pc.At, pc.At+n)
			p.Grad.Name = p.Name
			o.views = append(o.views, View{Param: p, Piece: pc, Unit: u.Name})
			o.viewOf[pc.Range.Param] = p
			if pc.Range.Decay {
				decay = append(decay, p)
			} else {
				none = append(none, p)
			}
		}
	}
	for _, p := range lay.Whole {
		o.viewOf[p] = p
		if len(p.Shape()) >= 2 {
			decay = append(decay, p)
		} else {
			none = append(none, p)
		}
	}
	groups := []optim.Group{{Params: decay, WeightDecay: cfg.Train.WeightDecay}, {Params: none, WeightDecay: 0}}
	o.inner = trainer.NewOptimizer(cfg, groups, alloc)
	return o
}

// Step implements optim.Optimizer: it updates the owned shard in place.
func (o *ShardOptimizer) Step(lr float64) error { return o.inner.Step(lr) }

// StepScaled implements optim.ScaledStepper: the inner optimizer's own, or
// its step after the gradients are scaled.
func (o *ShardOptimizer) StepScaled(lr, gradScale float64) error {
	return optim.StepScaled(o.inner, lr, gradScale)
}

// Params implements optim.Optimizer: the shard views, decayed ones first.
func (o *ShardOptimizer) Params() []*tensor.Tensor { return o.inner.Params() }

// State implements optim.Optimizer: the state of the owned views, named
// after them (e.g. "exp_avg.wte.weight[0:4352]").
func (o *ShardOptimizer) State() map[string]*tensor.Tensor { return o.inner.State() }

// Steps implements optim.StepCounter when the inner optimizer counts steps
// (AdamW), so a resumed run corrects its shard's moments at the right step.
func (o *ShardOptimizer) Steps() map[string]int {
	if c, ok := o.inner.(optim.StepCounter); ok {
		return c.Steps()
	}
	return nil
}

// SetSteps implements optim.StepCounter.
func (o *ShardOptimizer) SetSteps(counts map[string]int) error {
	c, ok := o.inner.(optim.StepCounter)
	if !ok {
		if len(counts) > 0 {
			return fmt.Errorf("zero: the shard optimizer keeps no step counts")
		}
		return nil
	}
	return c.SetSteps(counts)
}

// Views lists the shard views with the parameter range each covers.
func (o *ShardOptimizer) Views() []View { return o.views }
