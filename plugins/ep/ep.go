// Package ep is expert parallel: the experts of every MoE block are split
// over groups of ep data × context-parallel ranks, and each token travels
// to the rank holding its expert and back (all-to-all, see exchange.go).
//
// The dp·cp ranks, numbered i = dp·cp_size + cp, form dp·cp/ep
// expert-parallel groups of ep consecutive numbers: [k·ep, (k+1)·ep) is
// group k, and the rank at position j in its group holds experts
// [j·E/ep, (j+1)·E/ep) of every MoE block. The ranks at the same position
// in every group hold the same experts: an expert's replicas, dp·cp/ep of
// them, which form its gradient group.
//
// Placements say it: a local expert's parameters are held along dp (and
// cp) by its replicas (place.Held); the other experts' parameters are not
// on this rank at all. So checkpoints (each expert written once, by its
// first replica), resume at another ep, the gradient norm and export need
// nothing of this package. DDP (plugins/ddp) reduces only the parameters
// every rank of its group holds; this plugin reduces the experts'. ZeRO
// (plugins/zero) takes the experts over (HandOver): it shards them over
// their replicas and reduces their gradients itself.
//
// An expert's gradient is summed over its replicas and divided by dp·cp
// (Megatron's expert gradient scaling): each rank's loss is the mean over
// its own tokens and the step's loss the mean over the dp·cp ranks, and
// the experts of one replica saw the tokens of its whole group, so the sum
// over the replicas covers every token once, as one process's gradient.
package ep

import (
	"errors"
	"fmt"
	"slices"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/optim"
	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trace"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// EP is the expert-parallel plugin of one rank. It implements
// trainer.Preparer, GradReadier, PreStepper and PostStepper.
type EP struct {
	size, rank, dpcp int
	group            comm.Group // this rank's expert-parallel group
	replicas         comm.Group // the ranks holding the same experts (nil: alone)
	// copies is the replicas' group even when it has one rank; handed is
	// set once data parallel (ZeRO) shards and reduces the experts.
	copies comm.Group
	handed bool
	// held is where this rank's experts live along dp and cp.
	held    [2]place.Placement
	gather  bool // ep.dispatch allgather: the naive form
	naive   bool // ddp.mode naive: expert gradients reduced after backward
	experts []*tensor.Tensor
	mine    map[*tensor.Tensor]bool
	flight  []inflight
	x       *exchanger
}

// New carves the expert-parallel groups of size ep from the data ×
// context-parallel ranks of m that share this rank's tensor- and
// pipeline-parallel coordinates, numbered i = dp·cp_size + cp (cp
// fastest, as the dp_cp group): group k is i in [k·ep, (k+1)·ep). Under
// tensor parallel each tp rank so exchanges the same tokens as its tp
// peers, over its own groups. Every rank of the world calls it alike (it
// creates groups).
func New(m *mesh.Mesh, ep int, dispatch, ddpMode string) (*EP, error) {
	sh := m.Shape()
	n := sh.DP * sh.CP
	if ep < 1 || n%ep != 0 {
		return nil, fmt.Errorf("ep: parallel.ep=%d does not divide dp=%d × cp=%d = %d", ep, sh.DP, sh.CP, n)
	}
	if ep%sh.CP != 0 && sh.CP%ep != 0 {
		return nil, fmt.Errorf("ep: parallel.ep=%d must divide parallel.cp=%d or be a multiple of it, so that an expert's replicas are a grid of dp and cp ranks", ep, sh.CP)
	}
	me := m.Coord()
	i := me.DP*sh.CP + me.CP
	if dispatch != "alltoall" && dispatch != "allgather" && dispatch != "" {
		return nil, fmt.Errorf("ep: unknown ep.dispatch %q; use alltoall or allgather", dispatch)
	}
	e := &EP{size: ep, rank: i % ep, dpcp: n, gather: dispatch == "allgather", naive: ddpMode == "naive", mine: map[*tensor.Tensor]bool{}}
	w := m.WorldGroup()
	rankAt := func(i int) int { c := me; c.DP, c.CP = i/sh.CP, i%sh.CP; return sh.Rank(c) }
	// Every rank creates every group in the same order, keeping its own.
	for k := 0; k < n/ep; k++ {
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
	for j := 0; j < ep; j++ {
		var ranks []int
		for i := j; i < n; i += ep {
			ranks = append(ranks, rankAt(i))
		}
		g, err := w.NewNamedGroup("ep_replicas", ranks)
		if err != nil {
			return nil, fmt.Errorf("ep: expert replica group %v: %w", ranks, err)
		}
		if g != nil {
			e.copies = g
			if n > ep {
				e.replicas = g
			}
		}
	}
	// The replicas {i : i mod ep = j} as dp and cp coordinates: a grid,
	// since ep divides cp (every dp, the cp ≡ j mod ep) or cp divides ep
	// (the dp ≡ i/cp mod ep/cp, this cp).
	var dps, cps []int
	for i := e.rank; i < n; i += ep {
		if d := i / sh.CP; !slices.Contains(dps, d) {
			dps = append(dps, d)
		}
		if c := i % sh.CP; !slices.Contains(cps, c) {
			cps = append(cps, c)
		}
	}
	for a, held := range [][]int{dps, cps} {
		if len(held) < []int{sh.DP, sh.CP}[a] {
			slices.Sort(held)
			e.held[a] = place.Placement{Kind: place.Held, Ranks: held}
		}
	}
	return e, nil
}

// HandOver gives the reduction of the experts' gradients to data
// parallel (ZeRO, which shards the experts over their replicas): it
// returns the group of the ranks holding this rank's experts (one rank
// when ep = dp·cp) and the factor that turns a gradient averaged over it
// into the sum over the replicas divided by dp·cp, and from then on this
// plugin reduces nothing.
func (e *EP) HandOver() (comm.Group, float64) {
	e.handed = true
	return e.copies, float64(e.copies.Size()) / float64(e.dpcp)
}

// Name implements trainer.Plugin.
func (e *EP) Name() string { return "ep" }

// Prepare keeps this rank's experts of every MoE block, places them on
// their replicas, drops the others from the model and hands each MoE
// layer the exchange over the expert-parallel group. It runs on the
// described model, before any parameter has storage.
func (e *EP) Prepare(t *trainer.Trainer) error {
	e.x = &exchanger{g: e.group, alloc: t.Alloc, trace: t.Trace, gather: e.gather}
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
				p.Spec.Along[place.DP], p.Spec.Along[place.CP] = clone(e.held[0]), clone(e.held[1])
				e.experts = append(e.experts, p)
				e.mine[p] = true
			}
		}
		b.MoE.Dispatch = e.x
	}
	return nil
}

// GradReady implements trainer.GradReadier: in the overlapped form
// (ddp.mode bucketed) an expert's gradient, final in the step's last
// micro-batch, starts its sum over the replicas at once, behind the rest
// of backward. Replicas hold the same experts, so they start the same
// all-reduces in the same order.
func (e *EP) GradReady(t *trainer.Trainer, p *tensor.Tensor, info tensor.PassInfo) error {
	if e.naive || e.handed || e.replicas == nil || !info.Last || !e.mine[p] {
		return nil
	}
	span := t.Trace.Begin("all_reduce "+p.Name, "comm", trace.Comm).With("bytes", p.Grad.Bytes()).With("group", e.replicas.Name())
	e.flight = append(e.flight, inflight{p: p, h: e.replicas.AllReduceAsync(p.Grad, comm.Sum), span: span})
	return nil
}

// inflight is an expert gradient's all-reduce started by GradReady.
type inflight struct {
	p    *tensor.Tensor
	h    comm.Handle
	span trace.Span
}

// PreStep sums each local expert's gradient over its replicas and divides
// it by dp·cp. The naive form (ddp.mode naive) runs one blocking
// all-reduce per parameter here, in the model's order (the same on every
// replica); the overlapped form waits for those GradReady started and
// runs the rest (none when every expert's gradient was reported). An
// expert no token reached on any rank of the group gets a zero gradient,
// so every replica issues the same collectives.
func (e *EP) PreStep(t *trainer.Trainer) error {
	if e.handed {
		return nil
	}
	done := map[*tensor.Tensor]bool{}
	var errs []error
	for _, f := range e.flight {
		err := f.h.Wait()
		f.span.End()
		if err != nil {
			errs = append(errs, fmt.Errorf("ep: summing the gradient of %s over its replicas: %w", f.p.Name, err))
		}
		done[f.p] = true
	}
	e.flight = e.flight[:0]
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	for _, p := range e.experts {
		if p.Grad == nil {
			p.Grad = t.Alloc.New(tensor.Grads, p.DType(), p.Shape()...)
			p.Grad.Name = p.Name
		}
		if e.replicas != nil && !done[p] {
			span := t.Trace.Begin("all_reduce "+p.Name, "comm", trace.Comm).With("bytes", p.Grad.Bytes()).With("group", e.replicas.Name())
			err := e.replicas.AllReduce(p.Grad, comm.Sum)
			span.End()
			if err != nil {
				return fmt.Errorf("ep: summing the gradient of %s over its replicas: %w", p.Name, err)
			}
		}
	}
	optim.ScaleGrads(e.experts, 1/float64(e.dpcp))
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

func clone(p place.Placement) place.Placement {
	p.Ranks = slices.Clone(p.Ranks)
	return p
}
