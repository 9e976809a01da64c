package zero

import (
	"fmt"
	"strings"

	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// Estimator is ZeRO's term of the memory estimate (trainer.MemoryEstimator)
// for a stage, computed from the model shape alone: the units NewLayout
// would make (embed, each block, head), padded to the group size, and the
// buffers doc.go lists.
func Estimator(stage int) (trainer.MemoryEstimator, error) {
	if stage < 1 || stage > 3 {
		return nil, fmt.Errorf("zero: stage %d is not 1, 2 or 3 (set zero.stage; 0 means plain data parallel)", stage)
	}
	return &Zero{stage: stage}, nil
}

// unit is the estimate's view of one unit NewLayout makes: its parameter
// elements and whether it is a module's held unit (experts under expert
// parallel), sharded over the expert's replicas.
type unit struct {
	numel int
	held  bool
}

// unitNumels are the units NewLayout makes for the parameters ps a rank
// holds (the whole model's, or a tensor-parallel rank's parts), in
// forward order: the embed unit (wte, wpe), each block, the head (ln_f; a
// Llama's norm and lm_head), and whether the first is the embed unit.
// With held set, a block's experts form a unit of their own right after
// the block's (Layout's Held units). A frozen base's parameters (LoRA)
// are in no unit: pass the parameters that take a gradient.
func unitNumels(ps []nn.ParamShape, held bool) (units []unit, embed bool) {
	cur, hcur, name := 0, 0, ""
	flush := func() {
		units = append(units, unit{numel: cur})
		if hcur > 0 {
			units = append(units, unit{numel: hcur, held: true})
		}
		cur, hcur = 0, 0
	}
	for _, p := range ps {
		unit := "embed"
		switch {
		case strings.HasPrefix(p.Name, "h."):
			unit = p.Name[:strings.Index(p.Name[2:], ".")+2]
		case strings.HasPrefix(p.Name, "model.layers."): // a Llama's block
			unit = p.Name[:strings.Index(p.Name[len("model.layers."):], ".")+len("model.layers.")]
		case strings.HasPrefix(p.Name, "ln_f."), p.Name == nn.LlamaNormName, p.Name == nn.LlamaHeadName:
			unit = "head"
		}
		if unit != name && name != "" {
			flush()
		}
		if name == "" {
			embed = unit == "embed"
		}
		name = unit
		n := 1
		for _, d := range p.Shape {
			n *= d
		}
		if _, expert := nn.ExpertOf(p.Name); expert && held {
			hcur += n
		} else {
			cur += n
		}
	}
	flush()
	return units, embed
}

// EstimateMemory implements trainer.MemoryEstimator with the table of
// doc.go: P the padded parameters, N the group, T = 4·(embed unit + the
// largest two adjacent units) the gradients' transient working set of
// stages 2 and 3, G stage 3's gathered parameters. Under expert parallel
// a block's experts are a unit of their own with its own group (the
// replicas), so "P/N" is the sum of the units' shards and a module's two
// units count together where adjacent units would.
func (z *Zero) EstimateMemory(in trainer.EstimateInput, e *trainer.MemoryEstimate) error {
	n, r := in.DPSize, in.DPRank
	// ZeRO lays out the parameters that take a gradient; a frozen base
	// (LoRA) stays whole on every rank, beside the units.
	trained := trainer.TrainedOf(in.Model, in.Params)
	frozen := trainer.Numel(in.Params) - trainer.Numel(trained)
	// Under expert parallel the experts are held by some dp ranks only:
	// ZeRO shards each block's experts over their replicas, the R = n/ep
	// dp ranks at the same place of their expert-parallel groups (this
	// rank is number r/ep among them). Under context parallel (DDP only)
	// there is no ZeRO.
	ep := max(1, in.Cfg.Parallel.EP)
	units, hasEmbed := unitNumels(trained, ep > 1)
	var padded, owned, embed, pair, largest, shards int64
	sizes := make([]int64, len(units))
	for i, u := range units {
		g, gr := n, r
		if u.held {
			g, gr = n/ep, r/ep
		}
		size := int64((u.numel + g - 1) / g * g)
		sizes[i] = size
		padded += size
		shard := size / int64(g)
		shards += shard
		// This rank's shard [gr·shard, (gr+1)·shard) holds the unit's
		// elements below numel; padding has no optimizer state.
		lo, hi := int64(gr)*shard, int64(gr+1)*shard
		owned += max(0, min(hi, int64(u.numel))-lo)
		largest = max(largest, shard)
	}
	embed = sizes[0]
	first := 1
	if in.Model.TiedTable() == "" || !hasEmbed {
		// An untied head reads no table of the embed unit, which is then
		// gathered only around its own forward and backward: one unit of
		// the pairs.
		embed, first = 0, 0
	}
	// A module's units (a block's, and its experts' under expert
	// parallel) get their gradient buffers together (its backward hook)
	// while the unit after them is being reduce-scattered; under stage 3
	// they are gathered together beside the unit after them (the
	// forward's prefetch) or the one before (the backward's). Two
	// adjacent units when every module is one.
	var around int64
	for i := first; i < len(sizes); {
		j, mod := i+1, sizes[i]
		for ; j < len(sizes) && units[j].held; j++ {
			mod += sizes[j]
		}
		if j < len(sizes) || j-i > 1 {
			after := int64(0)
			if j < len(sizes) {
				after = sizes[j]
			}
			pair = max(pair, mod+after)
		}
		if i > first {
			around = max(around, sizes[i-1]+mod)
		}
		i = j
	}
	transient := 4 * (embed + pair)
	// Stage 3's gathered parameters: a module's units and a neighbour, or the embed
	// unit, the head and the last block prefetched during its backward.
	gathered := max(pair, around)
	if k := len(sizes); k >= 3 {
		gathered = max(gathered, embed+sizes[k-2]+sizes[k-1])
		// The embed unit and the first block, gathered together in the
		// forward: the larger when blocks differ (a MoE block's unit under
		// expert parallel, its experts in a unit of their own, is smaller
		// than a dense one).
		gathered = max(gathered, embed+sizes[1])
	}
	perElem := e.OptimBytes / max(1, trainer.Numel(trained)) // 8 for AdamW, 4 for SGD momentum
	e.OptimBytes = perElem * owned
	// Gradients the plugins before ZeRO added beyond the parameters'
	// (a pipeline stage's received inputs) are not ZeRO's to shard.
	otherGrads := e.GradsBytes - 4*trainer.Numel(trained)
	switch z.stage {
	case 1:
		e.ParamsBytes, e.GradsBytes = 4*padded, 4*padded
		e.CommBytes = 4 * shards
	case 2:
		e.ParamsBytes, e.GradsBytes = 4*padded, 4*shards+transient
	case 3:
		e.ParamsBytes, e.GradsBytes = 4*shards+4*gathered, 4*shards+transient
	}
	e.ParamsBytes += 4 * frozen
	e.GradsBytes += otherGrads
	if z.stage >= 2 && in.Cfg.Train.GradAccum > 1 {
		// Micro-batches after the first reduce-scatter into a borrowed
		// buffer while backward goes on: two shards in flight.
		e.CommBytes = 2 * 4 * largest
	}
	e.PeakBytes = e.ParamsBytes + e.GradsBytes + e.OptimBytes + e.ActPeak + e.CommBytes
	if k := len(sizes); z.stage >= 2 && k >= 3 {
		// The activations peak as the backward starts (the backward
		// frees them as it goes): the gradients then being formed, and
		// under stage 3 the units gathered, are the embed unit's, the
		// head's and the last block's, not the largest pair's.
		end := 4 * (embed + sizes[k-2] + sizes[k-1])
		e.PeakBytes += end - transient
		if z.stage == 3 {
			e.PeakBytes += end - 4*gathered
		}
		// Reduce-scatters in flight begin with the head's gradients,
		// after the activations' peak.
		e.PeakBytes -= e.CommBytes
	}
	if z.stage == 1 {
		// Stage 1's comm buffers are borrowed at the step's end, when the
		// activations are gone.
		e.PeakBytes -= e.CommBytes
	}
	return nil
}
