package config

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRecomputeKeys: the defaults, and every bad value an error naming
// its key.
func TestRecomputeKeys(t *testing.T) {
	d := Defaults()
	require.Equal(t, "none", d.Recompute.Granularity)
	require.Equal(t, []string{"norm", "mlp_act"}, d.Recompute.Modules)
	require.Equal(t, 0, d.Recompute.Blocks)
	for _, c := range []struct {
		apply func(c *Config)
		err   string
	}{
		{func(c *Config) { c.Recompute.Granularity = "partial" },
			`config: recompute.granularity="partial" is not supported: use one of none, selective, full`},
		{func(c *Config) { c.Recompute.Modules = []string{"norm", "softmax"} },
			`config: recompute.modules=[norm,softmax] names "softmax": use any of norm, mlp_act, attn_core`},
		{func(c *Config) { c.Recompute.Modules = []string{"norm", "norm"} },
			`config: recompute.modules=[norm,norm] names "norm" twice: name each once`},
		{func(c *Config) { c.Recompute.Granularity, c.Recompute.Modules = "selective", nil },
			`config: recompute.granularity=selective with recompute.modules=[] drops nothing: name any of norm, mlp_act, attn_core, or set recompute.granularity=none`},
		{func(c *Config) { c.Recompute.Blocks = -1 },
			`config: recompute.blocks=-1 must not be negative: set it to 0 or more`},
		{func(c *Config) { c.Recompute.Blocks = 5 },
			`config: recompute.blocks=5 exceeds model.n_layer=4: give at most the number of blocks, or 0 for all`},
	} {
		cfg := Defaults()
		c.apply(&cfg)
		require.EqualError(t, cfg.Validate(), c.err)
	}
	for _, g := range []string{"none", "selective", "full"} {
		cfg := Defaults()
		cfg.Recompute.Granularity, cfg.Recompute.Blocks = g, 4
		require.NoError(t, cfg.Validate(), g)
	}
}

// A list printed by `config show` ("[a, b]") is read back as the same list.
func TestListAsShownReadsBack(t *testing.T) {
	r, err := Load("", nil, []string{"--recompute.modules=[norm, attn_core]"})
	require.NoError(t, err)
	require.Equal(t, []string{"norm", "attn_core"}, r.Config.Recompute.Modules)
	require.Equal(t, "[norm, attn_core]", Values(r.Config)["recompute.modules"])
	r, err = Load("", []string{"TINYACC_PLUGINS__PROCESS=[]"}, nil)
	require.NoError(t, err)
	require.Empty(t, r.Config.Plugins.Process)
}
