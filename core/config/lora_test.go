package config

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLoRAKeys: the defaults, the targets by architecture, and every bad
// value an error naming its key (a target that names no module lists the
// model's modules).
func TestLoRAKeys(t *testing.T) {
	d := Defaults()
	require.Equal(t, 0, d.LoRA.Rank)
	require.Equal(t, 16.0, d.LoRA.Alpha)
	require.Equal(t, 0.0, d.LoRA.Dropout)
	require.Equal(t, []string{"c_attn"}, d.LoRA.Targets)
	require.Equal(t, "none", d.LoRA.TrainBiases)

	r, err := Load("", nil, []string{"--model.arch=llama", "--lora.rank=8"})
	require.NoError(t, err)
	require.Equal(t, []string{"q_proj", "v_proj"}, r.Config.LoRA.Targets)
	r, err = Load("", nil, []string{"--lora.rank=8", "--lora.targets=c_proj,mlp.c_fc"})
	require.NoError(t, err)
	require.Equal(t, []string{"c_proj", "mlp.c_fc"}, r.Config.LoRA.Targets)

	for _, c := range []struct {
		apply func(c *Config)
		err   string
	}{
		{func(c *Config) { c.LoRA.Rank = -1 }, `config: lora.rank=-1 must not be negative: set it to 0 or more`},
		{func(c *Config) { c.LoRA.Alpha = 0 }, `config: lora.alpha=0 must be > 0: the update is scaled by alpha/rank; use a value such as 16`},
		{func(c *Config) { c.LoRA.Dropout = 1 }, `config: lora.dropout=1 must be in [0, 1): use 0 for no dropout`},
		{func(c *Config) { c.LoRA.TrainBiases = "lora_only" }, `config: lora.train_biases="lora_only" is not supported: use one of none, all`},
		{func(c *Config) { c.LoRA.Rank, c.LoRA.Targets = 4, []string{"c_attn", "q_proj"} },
			`config: lora.targets=[c_attn,q_proj] names "q_proj", which is no module of model.arch=gpt2: use any of attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj (or their last part, as c_attn or q_proj)`},
		{func(c *Config) { c.LoRA.Rank, c.LoRA.Targets = 4, nil },
			`config: lora.rank=4 with lora.targets=[] trains nothing: name any of attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj`},
		{func(c *Config) { c.LoRA.Rank, c.Model.MoE.Experts = 4, 2 },
			`config: lora.rank=4 with model.moe.experts=2: adapters on mixture-of-experts blocks are not available in this build; set model.moe.experts=0 or lora.rank=0`},
	} {
		cfg := Defaults()
		c.apply(&cfg)
		require.EqualError(t, cfg.Validate(), c.err)
	}
	// A target names no module only when LoRA is on: lora.rank=0 ignores it.
	cfg := Defaults()
	cfg.LoRA.Targets = []string{"nothing"}
	require.NoError(t, cfg.Validate())

	_, err = Load("", nil, []string{"--model.arch=llama", "--lora.rank=8", "--lora.targets=c_attn"})
	require.EqualError(t, err, `config: lora.targets=[c_attn] names "c_attn", which is no module of model.arch=llama: use any of self_attn.q_proj, self_attn.k_proj, self_attn.v_proj, self_attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj (or their last part, as c_attn or q_proj)`)
}

// The match is PEFT's: the whole name, or its last parts on a dot.
func TestLoRATargeted(t *testing.T) {
	require.True(t, LoRATargeted("attn.c_proj", []string{"c_proj"}))
	require.True(t, LoRATargeted("mlp.c_proj", []string{"c_proj"}))
	require.False(t, LoRATargeted("mlp.c_proj", []string{"attn.c_proj"}))
	require.False(t, LoRATargeted("attn.c_attn", []string{"attn"}))
	require.False(t, LoRATargeted("attn.c_proj", []string{"proj"}))
}
