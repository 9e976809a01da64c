package config

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
	assert.NoError(t, c.CheckWorld(4), "tensor parallel")
	c.TP.SequenceParallel = true
	assert.EqualError(t, c.CheckWorld(4), "config: model.moe.experts=8 with tp.sequence_parallel: a MoE block routes the whole sequence on every tensor-parallel rank in this build; set tp.sequence_parallel=false")
}

// parallel.ep must divide the experts and the data × context-parallel
// ranks; the errors name the numbers, and layouts ep does not compose
// with are refused naming their keys.
func TestExpertParallelKeys(t *testing.T) {
	c := Defaults()
	c.Parallel.EP = 2
	assert.ErrorContains(t, c.Validate(), "config: parallel.ep=2 splits experts, but model.moe.experts=0: set model.moe.experts to a multiple of 2 or parallel.ep=1")
	c.Model.MoE.Experts = 6
	c.Parallel.EP = 4
	assert.ErrorContains(t, c.Validate(), "config: parallel.ep=4 does not divide model.moe.experts=6: every expert-parallel rank holds the same number of experts")
	c.Model.MoE.Experts = 8
	require.NoError(t, c.Validate())
	assert.NoError(t, c.CheckWorld(4))
	assert.NoError(t, c.CheckWorld(8))
	assert.EqualError(t, c.CheckWorld(6), "config: parallel.ep=4 does not divide dp=6 × cp=1 = 6: expert-parallel groups are carved from the data × context-parallel ranks; choose ep among the divisors of 6")
	c.Parallel.DP = 2
	assert.EqualError(t, c.CheckWorld(2), "config: parallel.ep=4 does not divide dp=2 × cp=1 = 2: expert-parallel groups are carved from the data × context-parallel ranks; choose ep among the divisors of 2")
	c.Parallel.DP, c.Parallel.EP = 0, 0
	assert.ErrorContains(t, c.Validate(), "config: parallel.ep=0 must be >= 1")
}
