package config

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func llamaConfig() Config {
	c := Defaults()
	c.Model.Arch = "llama"
	return c
}

func TestLlamaKeyMessages(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(c *Config)
		want   string
	}{
		{"arch", func(c *Config) { c.Model.Arch = "mistral" }, `config: model.arch="mistral" is not supported: use one of gpt2, llama`},
		{"kv heads divide", func(c *Config) { c.Model.NKVHead = 3 },
			"config: model.n_head=4 is not divisible by model.n_kv_head=3: every key/value head serves the same number of query heads; choose n_kv_head a divisor of n_head"},
		{"kv negative", func(c *Config) { c.Model.NKVHead = -1 },
			"config: model.n_kv_head=-1 must not be negative: use 0 (the default: n_head) or a divisor of model.n_head"},
		{"odd head", func(c *Config) { c.Model.NEmbd, c.Model.NHead = 12, 4 },
			"config: model.n_embd=12 / model.n_head=4 = 3 is an odd head size: rotary embeddings turn pairs of a head's dimensions; choose an even n_embd/n_head"},
		{"ffn", func(c *Config) { c.Model.IntermediateSize = -5 },
			"config: model.intermediate_size=-5 must not be negative: set it to 0 or more"},
		{"theta", func(c *Config) { c.Model.RopeTheta = 0 },
			"config: model.rope_theta=0 must be > 0: use 10000 (Llama 2) or 500000 (Llama 3)"},
		{"eps", func(c *Config) { c.Model.NormEps = -1 },
			"config: model.norm_eps=-1 must be > 0: use a small value such as 1e-5"},
		{"kv tp", func(c *Config) { c.Model.NHead, c.Model.NKVHead, c.Parallel.TP, c.Parallel.DP = 4, 1, 2, 1 },
			"config: model.n_kv_head=1 is not divisible by parallel.tp=2: tensor parallel gives every rank the same number of key/value heads; choose n_kv_head a multiple of tp"},
		{"ffn tp", func(c *Config) { c.Model.IntermediateSize, c.Parallel.TP = 345, 2 },
			"config: model.intermediate_size=345 is not divisible by parallel.tp=2: tensor parallel splits the SwiGLU width; choose intermediate_size a multiple of tp"},
		{"gpt2 kv", func(c *Config) { c.Model.Arch, c.Model.NKVHead = "gpt2", 2 },
			"config: model.n_kv_head=2 is a llama key, but model.arch=gpt2: drop model.n_kv_head or set model.arch=llama"},
		{"gpt2 theta", func(c *Config) { c.Model.Arch, c.Model.RopeTheta = "gpt2", 5e5 },
			"config: model.rope_theta=500000 is a llama key, but model.arch=gpt2: drop model.rope_theta or set model.arch=llama"},
	}
	for _, tc := range cases {
		c := llamaConfig()
		tc.mutate(&c)
		require.EqualError(t, c.Validate(), tc.want, tc.name)
	}
	c := llamaConfig()
	c.Model.NHead, c.Model.NKVHead, c.Model.IntermediateSize = 4, 2, 0
	require.NoError(t, c.Validate())
	require.Equal(t, 2, c.KVHeads())
	require.Equal(t, 384, c.FFNWidth(), "8/3 of 128 is 341.3, rounded up to a multiple of 64")
	c.Model.NKVHead = 0
	require.Equal(t, 4, c.KVHeads(), "n_kv_head defaults to n_head")
	require.Equal(t, 1408, DefaultIntermediateSize(512))
}

// A llama key given with gpt2 is an error naming it; a fully resolved
// gpt2 config, which writes every llama key at its default, loads again.
func TestLlamaKeysGivenWithGPT2(t *testing.T) {
	_, err := Load("", nil, []string{"--model.n_kv_head=2", "--model.norm_eps=2e-5", "--model.intermediate_size=64"})
	require.EqualError(t, err, "config: model.n_kv_head=2 is a llama key, but model.arch=gpt2: drop model.n_kv_head or set model.arch=llama\n"+
		"config: model.intermediate_size=64 is a llama key, but model.arch=gpt2: drop model.intermediate_size or set model.arch=llama\n"+
		"config: model.norm_eps=2e-05 is a llama key, but model.arch=gpt2: drop model.norm_eps or set model.arch=llama")
	r, err := Load("", nil, []string{"--model.tie_embeddings=true"})
	require.NoError(t, err, "gpt2 is tied: saying so is fine")
	require.True(t, r.Config.Model.TieEmbeddings)
	_, err = Load("", nil, []string{"--model.tie_embeddings=false"})
	require.EqualError(t, err, "config: model.tie_embeddings=false (from flag --model.tie_embeddings) with model.arch=gpt2: GPT-2's output head is always its token table; drop the key, or set model.arch=llama for an untied lm_head")
	resolved, err := Load("", nil, nil)
	require.NoError(t, err)
	require.True(t, resolved.Config.Model.TieEmbeddings, "gpt2 resolves tied")
	r, err = Load("", nil, []string{"--model.arch=llama"})
	require.NoError(t, err)
	require.False(t, r.Config.Model.TieEmbeddings, "llama defaults to an untied lm_head")
	var all []string
	for k, v := range Values(resolved.Config) {
		all = append(all, "--"+k+"="+strings.Trim(v, `"`))
	}
	_, err = Load("", nil, all)
	require.NoError(t, err, "every key given at its default value")
	r, err = Load("", nil, []string{"--model.arch=llama", "--model.n_kv_head=2", "--model.tie_embeddings=false"})
	require.NoError(t, err)
	require.Equal(t, 2, r.Config.KVHeads())
}
