package cp

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/trainer"
)

// Estimator is context parallel's term of the memory estimate
// (trainer.MemoryEstimator) for n ranks per group and the given attention
// ("ring" or "allgather"), from the config alone.
func Estimator(attention string, n int) (trainer.MemoryEstimator, error) {
	if n < 1 || (attention != "ring" && attention != "allgather") {
		return nil, fmt.Errorf("cp: no estimate for cp.attention=%q over %d ranks", attention, n)
	}
	return &estimator{ring: attention == "ring", n: n}, nil
}

type estimator struct {
	ring bool
	n    int
}

// EstimateMemory implements trainer.MemoryEstimator. Every sequence-sized
// tensor of the model holds T/n rows on a rank, so the activations are
// those of one process with context T/n (trainer.ActivationBytes); what
// differs from that is small beside it (the probabilities of the rank's
// own block are not kept but its log-sum-exp is, and wpe's gradient is
// whole). The all-gather form also keeps, per layer, the keys and values
// of the whole sequence for backward: 2·B·T·C floats (C/tp under tensor
// parallel). Parameters, gradients and optimizer state are replicated
// along CP: no term.
func (e *estimator) EstimateMemory(in trainer.EstimateInput, m *trainer.MemoryEstimate) error {
	mc := in.Model
	if mc.BlockSize%e.n != 0 {
		return fmt.Errorf("cp: block_size %d does not split over %d ranks", mc.BlockSize, e.n)
	}
	B, T, L := int64(in.Cfg.Train.BatchSize), int64(mc.BlockSize), int64(mc.NLayer)
	C := int64(mc.KVHeads() * mc.HeadSize() / max(1, in.Cfg.Parallel.TP)) // the key (or value) width: n_embd for GPT-2
	local := mc
	local.BlockSize = mc.BlockSize / e.n
	act := trainer.ActivationBytes(in.Cfg, local, trainer.ActLayout{TP: in.Cfg.Parallel.TP, SP: in.Cfg.TP.SequenceParallel, Ring: e.ring, CP: true})
	if !e.ring {
		// A fully recomputed block keeps no keys and values but while
		// its backward runs.
		k := int64(trainer.RecomputedBlocks(in.Cfg, mc.NLayer))
		act += 4 * (L - k + min(k, 1)) * 2 * B * T * C
	}
	m.PeakBytes += act - m.ActPeak
	m.ActPeak = act
	return nil
}
