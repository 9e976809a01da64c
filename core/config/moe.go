package config

import (
	"fmt"
	"math"
)

// validateMoE checks the model.moe.* keys; they matter only when
// model.moe.experts is above 0.
func (c *Config) validateMoE(v *validator) {
	m := c.Model.MoE
	if ep := c.Parallel.EP; ep > 1 {
		switch {
		case m.Experts <= 0:
			v.addf("config: parallel.ep=%d splits experts, but model.moe.experts=%d: set model.moe.experts to a multiple of %d or parallel.ep=1", ep, m.Experts, ep)
		case m.Experts%ep != 0:
			v.addf("config: parallel.ep=%d does not divide model.moe.experts=%d: every expert-parallel rank holds the same number of experts", ep, m.Experts)
		}
		if c.DDP.Process {
			v.addf("config: parallel.ep=%d with ddp.process=true: a DDP plugin process does not know expert placements; set ddp.process=false or parallel.ep=1", ep)
		}
	}
	if m.Experts < 0 {
		v.addf("config: model.moe.experts=%d must be >= 0 (0 = a dense model)", m.Experts)
	}
	if m.Experts <= 0 {
		return
	}
	if c.Model.Arch == "llama" {
		v.addf("config: model.moe.experts=%d with model.arch=llama: the experts are GPT-2 MLPs in this build; use model.arch=gpt2 or model.moe.experts=0", m.Experts)
	}
	if m.TopK < 1 || m.TopK > m.Experts {
		v.addf("config: model.moe.top_k=%d must be between 1 and model.moe.experts=%d", m.TopK, m.Experts)
	}
	if m.Every < 1 || m.Every > c.Model.NLayer {
		v.addf("config: model.moe.every=%d must be between 1 and model.n_layer=%d: every k-th block is a mixture of experts", m.Every, c.Model.NLayer)
	}
	if m.CapacityFactor < 0 || math.IsNaN(m.CapacityFactor) || math.IsInf(m.CapacityFactor, 0) {
		v.addf("config: model.moe.capacity_factor=%v must be 0 (dropless) or a positive number such as 1.25", m.CapacityFactor)
	}
	for _, k := range []struct {
		key string
		x   float64
	}{{"model.moe.aux_loss_coef", m.AuxLossCoef}, {"model.moe.z_loss_coef", m.ZLossCoef}} {
		if k.x < 0 || math.IsNaN(k.x) || math.IsInf(k.x, 0) {
			v.addf("config: %s=%v must be a number >= 0 (0 turns the loss off)", k.key, k.x)
		}
	}
}

// checkMoEWorld: mixtures of experts train on one process or under data,
// tensor, context and pipeline parallel (and expert parallel over the
// data × context-parallel ranks) in this build; sequence parallel does not
// route a rank's part of the sequence yet. parallel.ep must divide the
// dp·cp ranks the world leaves.
func (c Config) checkMoEWorld(world int) error {
	p := c.Parallel
	if c.Model.MoE.Experts > 0 && world > 1 && p.TP > 1 && c.TP.SequenceParallel {
		return fmt.Errorf("config: model.moe.experts=%d with tp.sequence_parallel: a MoE block routes the whole sequence on every tensor-parallel rank in this build; set tp.sequence_parallel=false", c.Model.MoE.Experts)
	}
	if p.EP > 1 {
		dp := p.DP
		if dp == 0 {
			dp = world / max(1, p.TP*p.PP*p.CP)
		}
		if dpcp := dp * p.CP; dpcp%p.EP != 0 {
			return fmt.Errorf("config: parallel.ep=%d does not divide dp=%d × cp=%d = %d: expert-parallel groups are carved from the data × context-parallel ranks; choose ep among the divisors of %d", p.EP, dp, p.CP, dpcp, dpcp)
		}
		if p.EP%p.CP != 0 && p.CP%p.EP != 0 {
			return fmt.Errorf("config: parallel.ep=%d must divide parallel.cp=%d or be a multiple of it", p.EP, p.CP)
		}
		if p.CP > 1 && (c.Zero.Stage > 0 || c.DDP.Process) {
			return fmt.Errorf("config: parallel.ep=%d with parallel.cp=%d trains under DDP only in this build, not zero.stage=%d or ddp.process; set zero.stage=0", p.EP, p.CP, c.Zero.Stage)
		}
	}
	return nil
}
