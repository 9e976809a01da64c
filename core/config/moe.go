package config

import (
	"fmt"
	"math"
)

// validateMoE checks the model.moe.* keys; they matter only when
// model.moe.experts is above 0.
func (c *Config) validateMoE(v *validator) {
	m := c.Model.MoE
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

// checkMoEWorld: mixtures of experts train on one process or under data
// parallel (DDP or ZeRO) in this build; tensor, pipeline and context
// parallel do not split or place experts yet.
func (c Config) checkMoEWorld(world int) error {
	p := c.Parallel
	if c.Model.MoE.Experts > 0 && world > 1 && (p.TP > 1 || p.PP > 1 || p.CP > 1) {
		return fmt.Errorf("config: model.moe.experts=%d trains under data parallel only in this build, not parallel.tp=%d pp=%d cp=%d; set them to 1", c.Model.MoE.Experts, p.TP, p.PP, p.CP)
	}
	return nil
}
