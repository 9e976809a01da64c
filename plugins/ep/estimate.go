package ep

import (
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// Estimator is expert parallel's term of the memory estimate: a rank
// holds its experts only (LocalParams), and its activations are those of
// the rows its experts process at the worst case, plus the exchange
// buffers (EstimateMemory).
type Estimator struct{ N int }

// LocalParams implements trainer.ParamLocalizer: the rank at position
// j = i mod N of its group (i = dp·cp_size + cp) keeps experts
// [j·E/N, (j+1)·E/N).
func (e Estimator) LocalParams(in trainer.EstimateInput, ps []nn.ParamShape) []nn.ParamShape {
	L := in.Model.MoE.Experts / e.N
	p := in.Cfg.Parallel
	j := (in.Rank / max(1, p.TP)) % (in.DPSize * max(1, p.CP)) % e.N
	var out []nn.ParamShape
	for _, p := range ps {
		if x, ok := nn.ExpertOf(p.Name); ok && x/L != j {
			continue
		}
		out = append(out, p)
	}
	return out
}

// Rows is the most rows the experts of one rank process in one MoE block
// when each of the N ranks of its group routes n tokens: dropless, every
// token of the group may choose min(top_k, E/N) of this rank's experts;
// with a capacity cap per expert and sender, E/N·cap from each sender.
func (e Estimator) Rows(m nn.MoEConfig, n int64) int64 {
	L := int64(m.Experts / e.N)
	rows := int64(e.N) * n * min(int64(m.TopK), L)
	if cap := m.Capacity(int(n)); cap > 0 {
		rows = min(rows, int64(e.N)*L*int64(cap))
	}
	return rows
}

// EstimateMemory implements trainer.MemoryEstimator: the rows this rank's
// experts process move from one process's MoERows to the worst case of
// Rows, and each MoE block holds its exchange buffers: the S rows it sends
// (S = MoERows: its tokens' assignments) and the R rows it receives, as
// received inputs and returned outputs with their gradients, 4·C·(S + R)
// elements.
func (e Estimator) EstimateMemory(in trainer.EstimateInput, est *trainer.MemoryEstimate) error {
	m := in.Model
	n := int64(in.Cfg.Train.BatchSize) * int64(m.BlockSize) / int64(max(1, in.Cfg.Parallel.CP)) // a cp rank routes its chunk
	s, r := trainer.MoERows(m.MoE, n), e.Rows(m.MoE, n)
	c := int64(m.NEmbd)
	extra := 4 * trainer.MoEBlocks(m) * (trainer.MoERowFloats(m)*(r-s) + 4*c*(s+r))
	est.ActPeak += extra
	est.PeakBytes += extra
	return nil
}
