package pp_test

import (
	"fmt"
	"testing"


	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// base is the tiny GPT of the pipeline tests: 4 blocks, so 4 stages fit.
func base(layers, m int) config.Config {
	c := ptest.Config()
	c.Model.NLayer = layers
	c.Train.Steps, c.Train.GradAccum, c.Train.BatchSize = 3, m, 2
	return c
}

func build(cfg config.Config) ptest.Build {
	return func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) { return plugins.Build(cfg, g) }
}

// run trains cfg on n ranks and holds every rank to one process with the
// same global batch (batch × dp sequences per micro-batch, the same
// micro-batches).
func run(t *testing.T, cfg config.Config, n int, backend, what string) []ptest.Result {
	single := cfg
	single.Parallel.PP, single.PP.Layers, single.PP.VirtualStages, single.PP.Schedule = 1, "", 1, "1f1b"
	single.Zero.Stage = 0
	dp := n / cfg.Parallel.PP
	single.Train.BatchSize = cfg.Train.BatchSize * dp
	want := ptest.Single(t, single)
	got := ptest.Parallel(t, cfg, n, backend, build(cfg))
	for r := range got {
		ptest.AssertEquivalent(t, want, got[r], fmt.Sprintf("%s, rank %d", what, r))
	}
	ptest.AssertReplicas(t, got, what)
	return got
}

func TestQuick(t *testing.T) {
	for _, s := range []string{"afab", "1f1b", "zb1", "interleaved"} {
		cfg := base(4, 2)
		cfg.Parallel.PP = 2
		cfg.PP.Schedule = s
		if s == "interleaved" {
			cfg.PP.VirtualStages = 2
		}
		run(t, cfg, 2, "local", s)
	}
}

