package config

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestValidatePipeline: the pipeline keys are refused before any rank
// starts, naming the keys and values.
func TestValidatePipeline(t *testing.T) {
	ok := Defaults()
	ok.Parallel.PP, ok.Model.NLayer, ok.Train.GradAccum = 2, 4, 4
	ok.PP.Schedule, ok.PP.VirtualStages, ok.PP.Layers = "interleaved", 2, "1,1,1,1"
	require.NoError(t, ok.Validate())
	ok.Zero.Stage = 1
	require.NoError(t, ok.Validate(), "ZeRO-1 composes with pipeline parallel")

	for _, c := range []struct {
		name   string
		mutate func(c *Config)
		want   string
	}{
		{"pp", func(c *Config) { c.Parallel.PP = 0 }, "config: parallel.pp=0 must be >= 1"},
		{"schedule", func(c *Config) { c.PP.Schedule = "gpipe" },
			`config: pp.schedule="gpipe" is not supported: use one of afab, 1f1b, interleaved, zb1`},
		{"virtual", func(c *Config) { c.PP.VirtualStages = 0 },
			"config: pp.virtual_stages=0 must be positive: set it to 1 or more"},
		{"virtual without interleaved", func(c *Config) { c.PP.VirtualStages = 2 },
			"config: pp.virtual_stages=2 needs pp.schedule=interleaved (pp.schedule=1f1b runs one chunk per rank): set pp.virtual_stages=1 or pp.schedule=interleaved"},
		{"more stages than layers", func(c *Config) { c.Parallel.PP = 8 },
			"config: parallel.pp=8 × pp.virtual_stages=1 = 8 model chunks, but model.n_layer=4: every chunk needs at least one block; lower parallel.pp or pp.virtual_stages"},
		{"more chunks than layers", func(c *Config) {
			c.Parallel.PP, c.PP.Schedule, c.PP.VirtualStages, c.Train.GradAccum = 2, "interleaved", 3, 2
		}, "config: parallel.pp=2 × pp.virtual_stages=3 = 6 model chunks, but model.n_layer=4: every chunk needs at least one block; lower parallel.pp or pp.virtual_stages"},
		{"interleaved micro-batches", func(c *Config) { c.Parallel.PP, c.PP.Schedule, c.Train.GradAccum = 2, "interleaved", 3 },
			"config: pp.schedule=interleaved needs train.grad_accum=3 (the micro-batches of a step) to be a multiple of parallel.pp=2"},
		{"zero 2", func(c *Config) { c.Parallel.PP, c.Zero.Stage = 2, 2 },
			"config: zero.stage=2 with parallel.pp=2: ZeRO-2 and ZeRO-3 reduce gradients inside every micro-batch's backward, but a pipeline sums the tied embedding's gradient over its first and last stage once per step, before any reduction; use zero.stage=1 (or 0) with pipeline parallel"},
		{"layers syntax", func(c *Config) { c.Parallel.PP, c.PP.Layers = 2, "2;2" },
			`config: pp.layers="2;2": want positive block counts separated by commas, such as 3,3,2`},
		{"layers count", func(c *Config) { c.Parallel.PP, c.PP.Layers = 2, "1,1,2" },
			`config: pp.layers="1,1,2" gives 3 chunks and 4 blocks; want parallel.pp × pp.virtual_stages = 2 chunks and model.n_layer = 4 blocks`},
		{"layers sum", func(c *Config) { c.Parallel.PP, c.PP.Layers = 2, "3,3" },
			`config: pp.layers="3,3" gives 2 chunks and 6 blocks; want parallel.pp × pp.virtual_stages = 2 chunks and model.n_layer = 4 blocks`},
	} {
		cfg := Defaults()
		c.mutate(&cfg)
		require.EqualError(t, cfg.Validate(), c.want, c.name)
	}
	c := Defaults()
	c.Parallel.PP, c.PP.Layers = 2, " 3, 1"
	l, err := c.PPLayers()
	require.NoError(t, err)
	require.Equal(t, []int{3, 1}, l)
}
