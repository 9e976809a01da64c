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

// unitNumels are the parameter elements of the units NewLayout makes for
// the parameters ps a rank holds (the whole model's, or a tensor-parallel
// rank's parts), in forward order: the embed unit (wte, wpe),
// each block, the head (ln_f; a Llama's norm and lm_head), and whether
// the first is the embed unit. A frozen base's parameters (LoRA) are in
// no unit: pass the parameters that take a gradient.
func unitNumels(ps []nn.ParamShape) (units []int, embed bool) {
	cur, name := 0, ""
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
			units = append(units, cur)
			cur = 0
		}
		if name == "" {
			embed = unit == "embed"
		}
		name = unit
		n := 1
		for _, d := range p.Shape {
			n *= d
		}
		cur += n
	}
	return append(units, cur), embed
}

// EstimateMemory implements trainer.MemoryEstimator with the table of
// doc.go: P the padded parameters, N the group, T = 4·(embed unit + the
// largest two adjacent units) the gradients' transient working set of
// stages 2 and 3, G stage 3's gathered parameters.
func (z *Zero) EstimateMemory(in trainer.EstimateInput, e *trainer.MemoryEstimate) error {
	n, r := in.DPSize, in.DPRank
	// ZeRO lays out the parameters that take a gradient; a frozen base
	// (LoRA) stays whole on every rank, beside the units.
	trained := trainer.TrainedOf(in.Model, in.Params)
	frozen := trainer.Numel(in.Params) - trainer.Numel(trained)
	// Under expert parallel the experts are held by some dp ranks only
	// and ZeRO keeps them whole (Layout.Whole): parameter, gradient and
	// optimizer bytes of one process.
	params, whole := trained, int64(0)
	// The float32 tensors ZeRO leaves whole (experts, a frozen base):
	// under mixed precision masters with a 2-byte copy each, as one
	// process keeps them.
	kept := frozenOf(in.Params, trained)
	if in.Cfg.Parallel.EP > 1 {
		params = nil
		for _, p := range trained {
			if _, expert := nn.ExpertOf(p.Name); expert {
				whole += trainer.Numel([]nn.ParamShape{p})
				kept = append(kept, p)
			} else {
				params = append(params, p)
			}
		}
	}
	numels, hasEmbed := unitNumels(params)
	var padded, owned, embed, pair, largest int64
	sizes := make([]int64, len(numels))
	for i, num := range numels {
		size := int64((num + n - 1) / n * n)
		sizes[i] = size
		padded += size
		shard := size / int64(n)
		// This rank's shard [r·shard, (r+1)·shard) holds the unit's
		// elements below num; padding has no optimizer state.
		lo, hi := int64(r)*shard, int64(r+1)*shard
		owned += max(0, min(hi, int64(num))-lo)
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
	for i := first; i+1 < len(sizes); i++ {
		pair = max(pair, sizes[i]+sizes[i+1])
	}
	transient := 4 * (embed + pair)
	// Stage 3's gathered parameters: two adjacent units, or the embed
	// unit, the head and the last block prefetched during its backward.
	gathered := pair
	if k := len(sizes); k >= 3 {
		gathered = max(pair, embed+sizes[k-2]+sizes[k-1])
		// The embed unit and the first block, gathered together in the
		// forward: the larger when blocks differ (MoE blocks whose experts
		// are kept whole under expert parallel are smaller than dense ones).
		gathered = max(gathered, embed+sizes[1])
	}
	perElem := e.OptimBytes / max(1, trainer.Numel(trained)) // 8 for AdamW, 4 for SGD momentum
	e.OptimBytes = perElem * (owned + whole)
	// Gradients the plugins before ZeRO added beyond the parameters'
	// (a pipeline stage's received inputs) are not ZeRO's to shard.
	otherGrads := e.GradsBytes - 4*trainer.Numel(trained)
	switch z.stage {
	case 1:
		e.ParamsBytes, e.GradsBytes = 4*padded, 4*padded
		e.CommBytes = 4 * padded / int64(n)
	case 2:
		e.ParamsBytes, e.GradsBytes = 4*padded, 4*padded/int64(n)+transient
	case 3:
		e.ParamsBytes, e.GradsBytes = 4*padded/int64(n)+4*gathered, 4*padded/int64(n)+transient
	}
	e.ParamsBytes += 4 * frozen
	e.GradsBytes += otherGrads
	e.ParamsBytes += 4 * whole
	e.GradsBytes += 4 * whole
	// Under mixed precision (mixed.go) the masters are this rank's shards
	// (4P/N) and the whole tensors kept beside the units, counted with the
	// optimizer state; the parameters' column is the 2-byte copies: the
	// whole copy of stages 1 and 2, stage 3's gathered units, and the
	// kept tensors' product weights. Units in use are widened to float32
	// (communication): 4G, as stage 3 gathers.
	var widened int64
	if mp := in.Cfg.Train.MixedPrecision; mp != "" && mp != "no" {
		e.OptimBytes += 4*padded/int64(n) + 4*(frozen+whole)
		e.ParamsBytes = 2*padded + 2*trainer.HalfCopyElems(in.Model, kept)
		if z.stage == 3 {
			e.ParamsBytes = 2*gathered + 2*trainer.HalfCopyElems(in.Model, kept)
		}
		widened = 4 * gathered
	}
	if z.stage >= 2 && in.Cfg.Train.GradAccum > 1 {
		// Micro-batches after the first reduce-scatter into a borrowed
		// buffer while backward goes on: two shards in flight.
		e.CommBytes = 2 * 4 * largest
	}
	e.PeakBytes = e.ParamsBytes + e.GradsBytes + e.OptimBytes + e.ActPeak + e.CommBytes + widened
	if k := len(sizes); z.stage >= 2 && k >= 3 {
		// The activations peak as the backward starts (the backward
		// frees them as it goes): the gradients then being formed, and
		// under stage 3 the units gathered, are the embed unit's, the
		// head's and the last block's, not the largest pair's.
		end := 4 * (embed + sizes[k-2] + sizes[k-1])
		e.PeakBytes += end - transient
		switch {
		case widened > 0 && z.stage == 3:
			e.PeakBytes += (end - 4*gathered) * 6 / 4 // 2-byte copy and float32
		case widened > 0:
			e.PeakBytes += end - 4*gathered
		case z.stage == 3:
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
