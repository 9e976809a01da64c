package ep

import (
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// Estimator is expert parallel's term of the memory estimate: a rank
// holds its experts only (LocalParams), and its activations are those of
// the rows its experts process at the worst case, plus the exchange
// buffers (EstimateMemory, by trainer.MoEBlockFloats).
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

// EstimateMemory implements trainer.MemoryEstimator: the rows this rank's
// experts process move from one process's count to the worst case, and
// each MoE block holds its exchange buffers (trainer.MoEBlockBytes with
// ep = N against 1: under mixed precision stored in 2 bytes, and widened
// by one block's backward). Under pipeline parallel the pipeline's estimator
// counts each stage's MoE blocks by the same rule, per micro-batch in
// flight, and this adds nothing.
func (e Estimator) EstimateMemory(in trainer.EstimateInput, est *trainer.MemoryEstimate) error {
	if in.Cfg.Parallel.PP > 1 {
		return nil
	}
	m := in.Model
	n := int64(in.Cfg.Train.BatchSize) * int64(m.BlockSize) / int64(max(1, in.Cfg.Parallel.CP)) // a cp rank routes its chunk
	tp, b := in.Cfg.Parallel.TP, trainer.PassActsE(in.Cfg.Train.MixedPrecision)
	held, widened := trainer.MoEBlockBytes(m, n, e.N, tp, b)
	held1, widened1 := trainer.MoEBlockBytes(m, n, 1, tp, b)
	extra := trainer.MoEBlocks(m)*(held-held1) + widened - widened1
	est.ActPeak += extra
	est.PeakBytes += extra
	return nil
}
