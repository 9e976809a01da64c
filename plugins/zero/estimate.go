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

// LaysOutMasters implements trainer.MastersLayer: under mixed precision
// ZeRO shards the float32 masters (mixed.go), and EstimateMemory counts
// them and the 2-byte copies.
func (z *Zero) LaysOutMasters() {}

// frozenOf is the parameters of all that are not in trained (a frozen
// base), in order.
func frozenOf(all, trained []nn.ParamShape) []nn.ParamShape {
	in := map[string]bool{}
	for _, p := range trained {
		in[p.Name] = true
	}
	var out []nn.ParamShape
	for _, p := range all {
		if !in[p.Name] {
			out = append(out, p)
		}
	}
	return out
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
// Llama's norm and lm_head), whether the first is the embed unit and
// whether the last is the head.
// With held set, a block's experts form a unit of their own right after
// the block's (Layout's Held units). A frozen base's parameters (LoRA)
// are in no unit: pass the parameters that take a gradient.
func unitNumels(ps []nn.ParamShape, held bool) (units []unit, embed, head bool) {
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
		name, head = unit, unit == "head"
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
	return units, embed, head
}

// EstimateMemory implements trainer.MemoryEstimator with the table of
// doc.go: P the padded parameters, N the group, T = 4·(embed unit + the
// largest two adjacent units) the gradients' transient working set of
// stages 2 and 3, G stage 3's gathered parameters. Under expert parallel
// a block's experts are a unit of their own with its own group (the
// replicas), so "P/N" is the sum of the units' shards and a module's two
// units count together where adjacent units would. Those columns are each
// category's own peak; the peak of stages 2 and 3 is the largest of the
// backward's moments (backwardMoments), each with what it holds at once.
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
	units, hasEmbed, hasHead := unitNumels(trained, ep > 1)
	// The float32 tensors ZeRO leaves whole (a frozen base): under mixed
	// precision masters with a 2-byte copy each, as one process keeps them.
	kept := frozenOf(in.Params, trained)
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
	// Under mixed precision (mixed.go) the masters are this rank's shards
	// and the frozen tensors kept beside the units, counted with the
	// optimizer state; the parameters' column is the 2-byte copies: the
	// whole copy of stages 1 and 2, stage 3's gathered units, and the
	// kept tensors' product weights. Units in use are widened to float32
	// (communication): 4G, as stage 3 gathers.
	var widened int64
	mixed := false
	if mp := in.Cfg.Train.MixedPrecision; mp != "" && mp != "no" {
		e.OptimBytes += 4*shards + 4*frozen
		e.ParamsBytes = 2*padded + 2*trainer.HalfCopyElems(in.Model, kept)
		if z.stage == 3 {
			e.ParamsBytes = 2*gathered + 2*trainer.HalfCopyElems(in.Model, kept)
		}
		widened = 4 * gathered
		mixed = true
	}
	if z.stage >= 2 && in.Cfg.Train.GradAccum > 1 {
		// Micro-batches after the first reduce-scatter into a borrowed
		// buffer while backward goes on: two shards in flight.
		e.CommBytes = 2 * 4 * largest
	}
	e.PeakBytes = e.ParamsBytes + e.GradsBytes + e.OptimBytes + e.ActPeak + e.CommBytes + widened
	if z.stage == 1 {
		// Stage 1's comm buffers are borrowed at the step's end, when the
		// activations are gone.
		e.PeakBytes -= e.CommBytes
	}
	if z.stage >= 2 && hasHead && len(sizes) >= 2 {
		// Each category above is its own peak, and they are reached at
		// different moments (the gathered units, the gradients in flight
		// and the activations at their most are not the same units'): the
		// simultaneous peak is the largest of the backward's moments,
		// each with what it holds beside what is held all step.
		held := e.OptimBytes + 4*shards + otherGrads + 4*frozen
		switch {
		case mixed:
			// The masters (shards and kept tensors) are in OptimBytes;
			// the kept tensors' 2-byte copies, and stage 2's whole copy.
			held = e.OptimBytes + 4*shards + otherGrads + 2*trainer.HalfCopyElems(in.Model, kept)
			if z.stage == 2 {
				held += 2 * padded
			}
		case z.stage == 2:
			held += 4 * padded
		default:
			held += 4 * shards
		}
		// Construction holds these alone: no unit is gathered and no
		// full gradient exists before the step.
		e.HeldBytes = held
		pass := trainer.RankPass(in.Cfg, in.Model)
		var most int64
		// A module's units (a block's and its experts') are one unit of
		// the moments: their gradients and gathers go together.
		var mods []int64
		for i, s := range sizes {
			if units[i].held {
				mods[len(mods)-1] += s
			} else {
				mods = append(mods, s)
			}
		}
		for _, mo := range backwardMoments(mods, hasEmbed, embed > 0, z.stage == 3 || mixed) {
			acts := pass.HeadMoment()
			if mo.block > 0 {
				acts = pass.BlockMoment(mo.block)
			}
			// The activations at the moment, as the layout's estimate
			// counts them (ActPeak at the pass's peak).
			b := e.ActPeak - (pass.Peak() - acts) + 4*mo.grads
			switch {
			case mixed && z.stage == 3:
				b += (2 + 4) * mo.gathered // the gathered 2-byte copies, widened
			case mixed:
				b += 4 * mo.gathered // the units in use, widened
			case z.stage == 3:
				b += 4 * mo.gathered
			}
			if in.Cfg.Train.GradAccum > 1 {
				b += 4 * mo.inFlight / int64(n) // a later micro-batch's borrowed shard
			}
			most = max(most, b)
		}
		e.PeakBytes = held + most
	}
	return nil
}

// moment is a point of a micro-batch's backward under stages 2 and 3:
// the block whose backward runs (1 the first, 0 the head's), and the
// units' elements held then beyond the shards: gathered parameters (stage
// 3), full gradients, and the one whose reduce-scatter is in flight.
type moment struct {
	block                     int
	gathered, grads, inFlight int64
}

// backwardMoments are the moments of the backward that can hold the most
// (stage3.go, stage12.go), for the units of sizes in forward order (the
// embed unit first when embed, the blocks, the head last); tied says the
// head reads the embed unit's table, and reuse that the table's gathered
// values are released before its gradient is allocated (stage 3, and
// every stage under mixed precision: NeedGrad):
//
//   - the head's, its logits' gradient beside everything saved: gathered
//     the head, the tied table and the last block prefetched; gradients
//     the head's and, unless reuse, the table's (with reuse, the table's
//     gradient replaces its values once the logits' input gradient is
//     computed: the same bytes);
//   - each block's, its MLP's backward: gathered the block and the one
//     before it, prefetched (not the embed unit, whose backward reads no
//     weight); gradients the block's, the next unit's still being
//     reduce-scattered, and the tied table's, which waits for the
//     embedding's backward.
func backwardMoments(sizes []int64, embed, tied, reuse bool) []moment {
	k, first, table := len(sizes), 0, int64(0)
	if embed {
		first = 1
	}
	if tied {
		table = sizes[0]
	}
	head := moment{gathered: table + sizes[k-1], grads: table + sizes[k-1]}
	if reuse {
		head.grads = sizes[k-1]
	}
	if k-2 >= first {
		head.gathered += sizes[k-2]
	}
	ms := []moment{head}
	for i := first; i < k-1; i++ {
		m := moment{block: i - first + 1, gathered: sizes[i], grads: table + sizes[i] + sizes[i+1], inFlight: sizes[i+1]}
		if i > first {
			m.gathered += sizes[i-1]
		}
		ms = append(ms, m)
	}
	return ms
}
