package trainer

import (
	"fmt"
	"strconv"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/nn"
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
// processed, one list per MoE block, summed over the micro-batches.
func (t *Trainer) takeMoEMetrics(step int, m *StepMetrics) {
	logLoad := (step+1)%max(1, t.Cfg.Train.LogEvery) == 0 || step == 0 || step == t.Cfg.Train.Steps-1
	for _, b := range t.Model.Blocks() {
		if b.MoE == nil {
			continue
		}
		s := b.MoE.TakeStats()
		if m == nil {
			continue
		}
		if s.Forwards > 0 {
			m.AuxLoss += s.Aux / float64(s.Forwards)
			m.ZLoss += s.Z / float64(s.Forwards)
		}
		m.DroppedTokens += s.Dropped
		if logLoad {
			load := s.Load
			if load == nil {
				load = make([]int64, b.MoE.Cfg.Experts)
			}
			m.ExpertLoad = append(m.ExpertLoad, load)
		}
	}
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
	return m, nil
}
