// Package ep is expert parallel: the experts of every MoE block are split
// over groups of ep data-parallel ranks, and each token travels to the
// rank holding its expert and back (all-to-all, see exchange.go).
//
// The data-parallel ranks (dp of them) form dp/ep expert-parallel groups
// of ep consecutive ranks: dp ranks [k·ep, (k+1)·ep) are group k, and the
// one at position j in its group holds experts [j·E/ep, (j+1)·E/ep) of
// every MoE block. The ranks at the same position in every group hold the
// same experts: an expert's replicas, dp/ep of them, which form its
// gradient group.
//
// Placements say it: a local expert's parameters are held along dp by its
// replicas (place.Held); the other experts' parameters are not on this
// rank at all. So checkpoints (each expert written once, by its first
// replica), resume at another ep, the gradient norm and export need
// nothing of this package. Data parallel (plugins/ddp) averages only the
// parameters every dp rank holds; this plugin reduces the experts'.
//
// An expert's gradient is summed over its replicas and divided by dp
// (Megatron's expert gradient scaling): each rank's loss is the mean over
// its own tokens and the step's loss the mean over the dp ranks, and the
// experts of one replica saw the tokens of its whole group, so the sum
// over the replicas covers every token once, as one process's gradient.
package ep

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/optim"
	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trace"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// EP is the expert-parallel plugin of one rank. It implements
// trainer.Preparer, PreStepper and PostStepper.
type EP struct {
	size, rank, dp int
	group          comm.Group // this rank's expert-parallel group
	replicas       comm.Group // the ranks holding the same experts (nil: alone)
	replicaDP      []int      // their dp coordinates, in order
	experts        []*tensor.Tensor
	x              *exchanger
}

// New carves the expert-parallel groups of size ep from the data-parallel
// ranks of m. Every rank of the world calls it alike (it creates groups).
func New(m *mesh.Mesh, ep int) (*EP, error) {
	sh := m.Shape()
	if sh.CP > 1 || sh.TP > 1 || sh.PP > 1 {
		return nil, fmt.Errorf("ep: parallel.ep=%d composes with data parallel only in this build, not parallel.tp=%d pp=%d cp=%d; set them to 1", ep, sh.TP, sh.PP, sh.CP)
	}
	if ep < 1 || sh.DP%ep != 0 {
		return nil, fmt.Errorf("ep: parallel.ep=%d does not divide dp=%d", ep, sh.DP)
	}
	me := m.Coord()
	e := &EP{size: ep, rank: me.DP % ep, dp: sh.DP}
	w := m.WorldGroup()
	rankAt := func(dp int) int { c := me; c.DP = dp; return sh.Rank(c) }
	// Every rank creates every group in the same order, keeping its own.
	for k := 0; k < sh.DP/ep; k++ {
		ranks := make([]int, ep)
		for j := range ranks {
			ranks[j] = rankAt(k*ep + j)
		}
		g, err := w.NewNamedGroup("ep", ranks)
		if err != nil {
			return nil, fmt.Errorf("ep: expert-parallel group %v: %w", ranks, err)
		}
		if g != nil {
			e.group = g
		}
	}
	e.replicaDP = e.replicaDPAt(e.rank)
	if len(e.replicaDP) > 1 {
		for j := 0; j < ep; j++ {
			dps := e.replicaDPAt(j)
			ranks := make([]int, len(dps))
			for i, d := range dps {
				ranks[i] = rankAt(d)
			}
			g, err := w.NewNamedGroup("ep_replicas", ranks)
			if err != nil {
				return nil, fmt.Errorf("ep: expert replica group %v: %w", ranks, err)
			}
			if g != nil {
				e.replicas = g
			}
		}
	}
	return e, nil
}

// replicaDPAt is the dp coordinates of the ranks at position j of their
// expert-parallel groups.
func (e *EP) replicaDPAt(j int) []int {
	var out []int
	for d := j; d < e.dp; d += e.size {
		out = append(out, d)
	}
	return out
}

// Name implements trainer.Plugin.
func (e *EP) Name() string { return "ep" }

// Prepare keeps this rank's experts of every MoE block, places them on
// their replicas, drops the others from the model and hands each MoE
// layer the exchange over the expert-parallel group. It runs on the
// described model, before any parameter has storage.
func (e *EP) Prepare(t *trainer.Trainer) error {
	e.x = &exchanger{g: e.group, alloc: t.Alloc, trace: t.Trace}
	for _, b := range t.Model.Blocks() {
		if b.MoE == nil {
			continue
		}
		E := b.MoE.Cfg.Experts
		if E%e.size != 0 {
			return fmt.Errorf("ep: parallel.ep=%d does not divide model.moe.experts=%d", e.size, E)
		}
		L := E / e.size
		for i, ex := range b.MoE.Experts {
			params := []*tensor.Tensor{ex.FcW, ex.FcB, ex.ProjW, ex.ProjB}
			if i/L != e.rank {
				for _, p := range params {
					if err := b.Module.DropParam(p.Name); err != nil {
						return fmt.Errorf("ep: %w", err)
					}
				}
				b.MoE.Experts[i] = nil
				continue
			}
			for _, p := range params {
				p.Spec.Along[place.DP] = place.Placement{Kind: place.Held, Ranks: append([]int(nil), e.replicaDP...)}
				e.experts = append(e.experts, p)
			}
		}
		b.MoE.Dispatch = e.x
	}
	return nil
}

// PreStep sums each local expert's gradient over its replicas and divides
// it by dp, one blocking all-reduce per parameter in the model's order
// (the same on every replica). An expert no token reached on any rank of
// the group gets a zero gradient, so every replica issues the same
// collectives.
func (e *EP) PreStep(t *trainer.Trainer) error {
	for _, p := range e.experts {
		if p.Grad == nil {
			p.Grad = t.Alloc.New(tensor.Grads, p.DType(), p.Shape()...)
			p.Grad.Name = p.Name
		}
		if e.replicas != nil {
			span := t.Trace.Begin("all_reduce "+p.Name, "comm", trace.Comm).With("bytes", p.Grad.Bytes()).With("group", e.replicas.Name())
			err := e.replicas.AllReduce(p.Grad, comm.Sum)
			span.End()
			if err != nil {
				return fmt.Errorf("ep: summing the gradient of %s over its replicas: %w", p.Name, err)
			}
		}
	}
	optim.ScaleGrads(e.experts, 1/float64(e.dp))
	return nil
}

// PostStep implements trainer.PostStepper: it reports the rows the
// step's forwards exchanged with other ranks (StepMetrics.ExpertRows).
func (e *EP) PostStep(t *trainer.Trainer, m *trainer.StepMetrics) error {
	if m != nil {
		m.ExpertRows = e.x.rows
	}
	e.x.rows = 0
	return nil
}
