package trainer

import (
	"fmt"
	"strconv"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// moeConfig is the model.moe.* section as the model takes it.
func moeConfig(cfg config.Config) nn.MoEConfig {
	m := cfg.Model.MoE
	if m.Experts == 0 {
		return nn.MoEConfig{}
	}
	return nn.MoEConfig{Experts: m.Experts, TopK: m.TopK, Every: m.Every, CapacityFactor: m.CapacityFactor,
		AuxLossCoef: m.AuxLossCoef, ZLossCoef: m.ZLossCoef, AuxScale: 1 / float64(max(1, cfg.Train.GradAccum))}
}

// takeMoEMetrics reads and resets the MoE blocks' statistics of step
// (0-based) once its micro-batches have run, into m's fields (nil: only
// reset). A step of a MoE model reports, beside the language-model loss
// (which `loss` stays), the auxiliary losses added to the training loss,
// summed over the MoE blocks and averaged over the step's micro-batches as
// the loss is; the token-to-expert assignments a capacity dropped; and on
// the steps that log a line (train.log_every) the tokens each expert
// processed, one list per MoE block, summed over the micro-batches. Under
// pipeline parallel each stage fills its own blocks' entries and one
// all-reduce over the pipeline group puts every block's on every stage.
func (t *Trainer) takeMoEMetrics(step int, m *StepMetrics) error {
	logLoad := (step+1)%max(1, t.Cfg.Train.LogEvery) == 0 || step == 0 || step == t.Cfg.Train.Steps-1
	// One row per MoE block of the whole model: aux, z, the tokens per
	// expert, the drops.
	mc := GPTConfig(t.Cfg)
	E := mc.MoE.Experts
	row := map[int]int{}
	for i := 0; i < mc.NLayer; i++ {
		if mc.MoE.IsMoE(i) {
			row[i] = len(row)
		}
	}
	w := E + 3
	all := make([]float64, len(row)*w)
	for _, b := range t.Model.Blocks() {
		if b.MoE == nil {
			continue
		}
		s := b.MoE.TakeStats()
		if m == nil {
			continue
		}
		v := all[row[b.Index]*w : (row[b.Index]+1)*w]
		if s.Forwards > 0 {
			v[0], v[1] = s.Aux/float64(s.Forwards), s.Z/float64(s.Forwards)
		}
		// Tokens per expert and drops, summed over the ranks that share
		// the micro-batches (every rank takes part: the condition is the
		// same everywhere).
		counts := v[2:]
		for e, n := range s.Load {
			counts[e] = float64(n)
		}
		counts[E] = float64(s.Dropped)
		if b.MoE.Reduce != nil {
			if err := b.MoE.Reduce(counts); err != nil {
				return fmt.Errorf("trainer: MoE expert load: %w", err)
			}
		}
	}
	if m == nil {
		return nil
	}
	if t.Mesh != nil && t.Mesh.PP() != nil && t.Mesh.PP().Size() > 1 {
		buf := tensor.FromF64(all, len(all))
		if err := t.Mesh.PP().AllReduce(buf, comm.Sum); err != nil {
			return fmt.Errorf("trainer: MoE metrics over the pipeline stages: %w", err)
		}
		copy(all, buf.F64())
	}
	for k := 0; k < len(row); k++ {
		v := all[k*w : (k+1)*w]
		m.AuxLoss += v[0]
		m.ZLoss += v[1]
		m.DroppedTokens += int64(v[2+E])
		if logLoad {
			load := make([]int64, E)
			for e := range load {
				load[e] = int64(v[2+e])
			}
			m.ExpertLoad = append(m.ExpertLoad, load)
		}
	}
	return nil
}

// wireMoE hands the MoE blocks the data × context-parallel group, over
// which their load-balancing statistics are summed (a context-parallel
// rank routes its own chunk of the tokens; a pipeline stage's blocks see
// its micro-batches whole; the ranks of a tensor-parallel group route the
// same tokens alike). A rank's part of the sequence (sequence parallel) is
// not routed in this build, so a mesh with it is refused.
func (t *Trainer) wireMoE() error {
	if t.Cfg.Model.MoE.Experts == 0 || t.Mesh == nil {
		return nil
	}
	sh := t.Mesh.Shape()
	if sh.TP > 1 && t.Cfg.TP.SequenceParallel {
		return fmt.Errorf("trainer: model.moe.experts=%d with tp.sequence_parallel: a MoE block routes the whole sequence on every tensor-parallel rank in this build; set tp.sequence_parallel=false", t.Cfg.Model.MoE.Experts)
	}
	g := t.Mesh.DPCP()
	if g == nil || g.Size() == 1 {
		return nil
	}
	reduce := func(v []float64) error {
		x := tensor.FromF64(v, len(v))
		if err := g.AllReduce(x, comm.Sum); err != nil {
			return err
		}
		copy(v, x.F64())
		return nil
	}
	for _, b := range t.Model.Blocks() {
		if b.MoE != nil {
			b.MoE.Reduce, b.MoE.Ranks = reduce, g.Size()
		}
	}
	return nil
}

// checkpointMoE returns the experts a checkpoint's index records
// (model.moe.*; an index without them is of a dense model): what decides
// the model's parameters, so export and the checkpoint tools see them.
func checkpointMoE(recorded map[string]any) (nn.MoEConfig, error) {
	var m nn.MoEConfig
	for _, f := range []struct {
		key string
		dst *int
	}{{"model.moe.experts", &m.Experts}, {"model.moe.top_k", &m.TopK}, {"model.moe.every", &m.Every}} {
		v, ok := recorded[f.key]
		if !ok {
			return nn.MoEConfig{}, nil
		}
		n, err := strconv.Atoi(fmt.Sprint(v))
		if err != nil {
			return m, fmt.Errorf("ckpt: the index records %s=%v, not a whole number", f.key, v)
		}
		*f.dst = n
	}
	if m.Experts == 0 {
		return nn.MoEConfig{}, nil
	}
	if v, ok := recorded["model.moe.capacity_factor"]; ok {
		f, err := strconv.ParseFloat(fmt.Sprint(v), 64)
		if err != nil {
			return m, fmt.Errorf("ckpt: the index records model.moe.capacity_factor=%v, not a number", v)
		}
		m.CapacityFactor = f
	}
	return m, nil
}

// MoEActivationFloats is what the MoE blocks of m add to the activations
// of the dense model (ActivationBytes) in one micro-batch of B sequences
// on one rank of a tensor-parallel group of tp (1: none), in elements.
// Per MoE block of N = B·T tokens:
//
//   - MoERowFloats per row its experts process (MoERows of them): the
//     gathered input (C), the 4C-wide hidden layer before and after
//     GELU (4C/tp each under tensor parallel, which splits each expert
//     like the dense MLP), its output (C), and the row's routing weight
//     and index (the backward frees each gradient once consumed, so no
//     row's gradients add to the peak);
//   - C·N·E + 5·N·E: each expert's input gradient scattered back into a
//     [N, C] buffer, and the router's logits, probabilities and their
//     gradients;
//   - minus (2 + 12/tp)·N·C: the dense MLP's terms the experts replace
//     (14·N·C on one rank): its input and output, whole, and its
//     hidden layer before and after GELU and that layer's gradient in
//     backward, split by tensor parallel as BlockActsOf splits them.
//
// Fitted to the allocator's count over E, k, B·T, C and n_layer, it holds
// to 15% like the dense terms (TestMoEEstimateCountsExperts).
func MoEActivationFloats(m nn.GPTConfig, B, tp int) int64 {
	return MoEBlocks(m) * MoEBlockFloats(m, int64(B)*int64(m.BlockSize), 1, tp)
}

// MoEBlockFloats is the one rule of what a MoE block adds to a dense
// block's activations for the n tokens a rank routes in one micro-batch,
// with its experts spread over ep ranks (1: all on this rank) and split
// over tp (1: whole), in elements: MoEActivationFloats's terms per block, where under expert
// parallel the rows this rank's experts process are the worst case of
// MoEWorstRows and the block also holds its exchange buffers, 2·C·(S + R)
// for the S rows it sends (MoERows: its tokens' assignments) and the R it
// receives, as received inputs and returned outputs (the backward frees
// their gradients as it consumes them).
// The whole model's estimate and a pipeline stage's (plugins/pp, per
// micro-batch in flight) both count MoE blocks by it.
func MoEBlockFloats(m nn.GPTConfig, n int64, ep, tp int) int64 {
	if m.MoE.Experts == 0 {
		return 0
	}
	c, e := int64(m.NEmbd), int64(m.MoE.Experts)
	s := MoERows(m.MoE, n)
	rows, buffers := s, int64(0)
	if ep > 1 {
		rows = MoEWorstRows(m.MoE, n, ep)
		buffers = 2 * c * (s + rows)
	}
	dense := 2*n*c + 12*n*c/int64(max(1, tp))
	return MoERowFloats(m, tp)*rows + c*n*e + 5*n*e - dense + buffers
}

// MoEBlockBytes is MoEBlockFloats in bytes for activations kept in e
// bytes (4; 2 under mixed precision, tensor.StoreHalf): held is what the
// block adds to the saved activations of a dense block from its forward
// to its backward, and widened what its own backward adds beside them.
// Under mixed precision a MoE block stores its rows (MoEStoredFloats) in
// 2 bytes, and the dense MLP's share it replaces was counted with its
// 4C/tp-wide hidden layer before and after GELU in 2 bytes too, so
// (4 − e)·8·N·C/tp fewer to take away; the router's probabilities and
// weights, the routing indices and every gradient stay float32. Its
// backward widens its rows again beside everything saved, in place of
// what the dense MLP's backward holds beyond float32's count
// ((4 − e)·4·N·C/tp, PassActs.BlockMoment's Widened). In float32 (e = 4)
// held is 4·MoEBlockFloats, widened 0.
// Fitted to the allocator over top_k 1, 2, 4, widths 32 and 64 and tp 1
// and 2 in bf16: within 5% (TestMoEEstimateCountsExperts).
func MoEBlockBytes(m nn.GPTConfig, n int64, ep, tp int, e int64) (held, widened int64) {
	f := MoEBlockFloats(m, n, ep, tp)
	if m.MoE.Experts == 0 || e >= 4 {
		return 4 * f, 0
	}
	dense := 8 * n * int64(m.NEmbd) / int64(max(1, tp))
	s := MoEStoredFloats(m, n, ep, tp)
	return 4*f - (4-e)*(s-dense), (4 - e) * (s - dense/2)
}

// MoEStoredFloats is the part of MoEBlockFloats's rows a block stores in
// its compute dtype under mixed precision: each row's input, hidden
// layer before and after GELU and output, and under expert parallel the
// exchanged rows.
func MoEStoredFloats(m nn.GPTConfig, n int64, ep, tp int) int64 {
	c := int64(m.NEmbd)
	s := MoERows(m.MoE, n)
	rows, buffers := s, int64(0)
	if ep > 1 {
		rows = MoEWorstRows(m.MoE, n, ep)
		buffers = 2 * c * (s + rows)
	}
	return (MoERowFloats(m, tp)-2)*rows + buffers
}

// MoEDeferredFloats is what a MoE block's backward keeps beyond
// MoEBlockFloats when it defers its weight gradients (a split backward,
// which frees nothing before its W): each row's gradients, MoERowFloats
// more per row its experts process (MoERows, or MoEWorstRows under
// expert parallel).
func MoEDeferredFloats(m nn.GPTConfig, n int64, ep, tp int) int64 {
	if m.MoE.Experts == 0 {
		return 0
	}
	rows := MoERows(m.MoE, n)
	if ep > 1 {
		rows = MoEWorstRows(m.MoE, n, ep)
	}
	return MoERowFloats(m, tp) * rows
}

// MoEWorstRows is the most rows the experts of one rank process in one
// MoE block when each of the ep ranks of its group routes n tokens:
// dropless, every token of the group may choose min(top_k, E/ep) of this
// rank's experts; with a capacity per expert and sender, E/ep·capacity
// from each sender.
func MoEWorstRows(m nn.MoEConfig, n int64, ep int) int64 {
	L := int64(m.Experts / ep)
	rows := int64(ep) * n * min(int64(m.TopK), L)
	if cap := m.Capacity(int(n)); cap > 0 {
		rows = min(rows, int64(ep)*L*int64(cap))
	}
	return rows
}

// MoERowFloats is the activation elements of one row an expert processes
// on a rank of a tensor-parallel group of tp: its input and output whole
// (C each), its 4C-wide hidden layer before and after GELU split (c_fc
// by columns), the routing weight and index.
func MoERowFloats(m nn.GPTConfig, tp int) int64 {
	c := int64(m.NEmbd)
	return 2*c + 8*c/int64(max(1, tp)) + 2
}

// MoEBlocks is the number of MoE blocks of m.
func MoEBlocks(m nn.GPTConfig) int64 {
	var blocks int64
	for i := 0; i < m.NLayer; i++ {
		if m.MoE.IsMoE(i) {
			blocks++
		}
	}
	return blocks
}

// MoERows is the most token-to-expert assignments the experts of one MoE
// block process for n tokens on one process: n·top_k dropless, and at
// most E·capacity with a capacity.
func MoERows(m nn.MoEConfig, n int64) int64 {
	rows := n * int64(m.TopK)
	if cap := m.Capacity(int(n)); cap > 0 {
		rows = min(rows, int64(m.Experts)*int64(cap))
	}
	return rows
}
