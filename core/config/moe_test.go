package config

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestMoEKeysValidated(t *testing.T) {
	c := Defaults()
	c.Model.MoE.Experts = 4
	assert.NoError(t, c.Validate(), "experts with the default top_k, every and coefficients")
	c.Model.MoE.TopK, c.Model.MoE.Every, c.Model.MoE.CapacityFactor = 5, 0, -1
	c.Model.MoE.AuxLossCoef, c.Model.MoE.ZLossCoef = -0.5, 0
	err := c.Validate()
	for _, want := range []string{
		"config: model.moe.top_k=5 must be between 1 and model.moe.experts=4",
		"config: model.moe.every=0 must be between 1 and model.n_layer=4: every k-th block is a mixture of experts",
		"config: model.moe.capacity_factor=-1 must be 0 (dropless) or a positive number such as 1.25",
		"config: model.moe.aux_loss_coef=-0.5 must be a number >= 0 (0 turns the loss off)",
	} {
		assert.ErrorContains(t, err, want)
	}
	c = Defaults()
	c.Model.MoE.Experts = -2
	assert.ErrorContains(t, c.Validate(), "config: model.moe.experts=-2 must be >= 0 (0 = a dense model)")
	c.Model.MoE.Experts = 8
	assert.NoError(t, c.CheckWorld(4), "data parallel")
	c.Parallel.TP = 2
	assert.EqualError(t, c.CheckWorld(4), "config: model.moe.experts=8 trains under data parallel only in this build, not parallel.tp=2 pp=1 cp=1; set them to 1")
}
