package ddp

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trace"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// allReduceEach is the naive form: after the step's last backward, average
// every gradient over the ranks, one blocking all-reduce per parameter, in
// the model's parameter order (the same on every rank).
func (d *DDP) allReduceEach(t *trainer.Trainer) error {
	for _, p := range replicated(t) {
		if p.Grad == nil {
			// No gradient reached p on this rank; a zero one keeps every
			// rank issuing the same collectives.
			p.Grad = t.Alloc.New(tensor.Grads, p.DType(), p.Shape()...)
			p.Grad.Name = p.Name
		}
		sent := p.Grad
		if d.halfWire(t) {
			sent = t.Alloc.New(tensor.Comm, tensor.BFloat16, p.Grad.Shape()...)
			roundInto(sent, p.Grad)
		}
		span := t.Trace.Begin("all_reduce "+p.Name, "comm", trace.Comm).With("bytes", sent.Bytes())
		err := d.g.AllReduce(sent, comm.Avg)
		span.End()
		if sent != p.Grad {
			if err == nil {
				widenInto(p.Grad, sent)
			}
			sent.Release()
		}
		if err != nil {
			return fmt.Errorf("ddp: all-reduce gradient of %s: %w", p.Name, err)
		}
	}
	return nil
}

// replicated lists the parameters DDP averages: those every rank of its
// group holds. A parameter held by only some data-parallel ranks (an
// expert placed by expert parallel, which differs from rank to rank) is
// reduced over its own replicas by the plugin that placed it.
func replicated(t *trainer.Trainer) []*tensor.Tensor {
	var out []*tensor.Tensor
	for _, p := range t.Model.TrainedParams() { // a frozen base (LoRA) has no gradient to move
		if !heldBySome(p) {
			out = append(out, p)
		}
	}
	return out
}

// heldBySome reports whether p's placement gives it to only some
// data- or context-parallel ranks.
func heldBySome(p *tensor.Tensor) bool {
	return p.Spec != nil && (p.Spec.Along[place.DP].Kind == place.Held || p.Spec.Along[place.CP].Kind == place.Held)
}
