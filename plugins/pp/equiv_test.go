package pp_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// base is the tiny GPT of the pipeline tests with the given number of
// blocks and micro-batches per step.
func base(layers, m int) config.Config {
	c := ptest.Config()
	c.Model.NLayer = layers
	c.Train.Steps, c.Train.GradAccum, c.Train.BatchSize = 3, m, 2
	return c
}

// base64 is base on ptest's float64 model (4 heads, 64 wide), one
// sequence per micro-batch: the equivalence tests hold it to 1e-9.
func base64(layers, m int) config.Config {
	c := ptest.Config64()
	c.Model.NLayer = layers
	c.Train.Steps, c.Train.GradAccum, c.Train.BatchSize = 3, m, 1
	return c
}

func build(cfg config.Config) ptest.Build {
	return func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) { return plugins.Build(cfg, g) }
}

// single is cfg in one process: the same micro-batches, each holding
// what the data-parallel ranks of one pipeline hold together.
func single(cfg config.Config, n int) config.Config {
	s := cfg
	s.Parallel.PP, s.Parallel.DP, s.PP.Layers, s.PP.VirtualStages, s.PP.Schedule = 1, 0, "", 1, "1f1b"
	s.Zero.Stage = 0
	s.Train.BatchSize = cfg.Train.BatchSize * n / cfg.Parallel.PP
	return s
}

// run trains cfg on n ranks and holds every rank to one process with the
// same global batch (ptest.Check: 1e-9 in float64), replicas to each other
// bitwise, and the two copies of the tied wte (first and last stage) to
// each other bitwise.
func run(t *testing.T, cfg config.Config, n int, backend, what string) []ptest.Result {
	t.Helper()
	want := ptest.Single(t, single(cfg, n))
	got := ptest.Parallel(t, cfg, n, backend, build(cfg))
	ptest.Check(t, want, got, what)
	p := cfg.Parallel.PP
	perStage := n / p
	for r := 0; r < perStage; r++ {
		first, last := got[r], got[(p-1)*perStage+r]
		require.Contains(t, first.Local, "wte.weight", what)
		require.Equal(t, first.Local["wte.weight"], last.Local["wte.weight"], "%s: the tied copies stay equal", what)
	}
	return got
}

// TestEquivalenceSchedules: pp in {2, 4} × every schedule × m in {p, 2p},
// each against one process on the same global batch.
func TestEquivalenceSchedules(t *testing.T) {
	for _, p := range []int{2, 4} {
		for _, name := range []string{"afab", "1f1b", "interleaved", "zb1"} {
			for _, m := range []int{p, 2 * p} {
				layers, v := 4, 1
				if name == "interleaved" {
					layers, v = 2*p, 2
				}
				cfg := base64(layers, m)
				cfg.Parallel.PP, cfg.PP.Schedule, cfg.PP.VirtualStages = p, name, v
				run(t, cfg, p, "local", fmt.Sprintf("pp %d %s m=%d", p, name, m))
			}
		}
	}
}

// TestEquivalenceUnevenSplits: 5 blocks on 2 stages (balanced by compute:
// 3 and 2, the head weighing on the last), an explicit 1,4 split, and 5
// blocks in 4 interleaved chunks.
func TestEquivalenceUnevenSplits(t *testing.T) {
	cfg := base64(5, 2)
	cfg.Parallel.PP = 2
	got := run(t, cfg, 2, "local", "5 blocks on 2 stages")
	require.Contains(t, got[0].Local, "h.2.ln_1.weight", "the first stage holds blocks 0-2")
	require.NotContains(t, got[1].Local, "h.2.ln_1.weight")
	require.NotContains(t, got[0].Local, "ln_f.weight", "the first stage holds no head")
	require.NotContains(t, got[1].Local, "wpe.weight", "the last stage holds no position embedding")

	cfg.PP.Layers = "1,4"
	got = run(t, cfg, 2, "local", "pp.layers=1,4")
	require.NotContains(t, got[0].Local, "h.1.ln_1.weight")
	require.Contains(t, got[1].Local, "h.1.ln_1.weight")

	cfg.PP.Layers, cfg.PP.Schedule, cfg.PP.VirtualStages = "", "interleaved", 2
	run(t, cfg, 2, "local", "5 blocks in 4 interleaved chunks")
	cfg.PP.Schedule, cfg.PP.VirtualStages = "zb1", 1
	run(t, cfg, 2, "local", "5 blocks, zb1")
}

// TestEquivalenceWithDataParallel: pp 2 × dp 2 with DDP (naive and
// bucketed, small buckets so several overlap backward) and ZeRO-1, under
// 1f1b and zb1.
func TestEquivalenceWithDataParallel(t *testing.T) {
	for _, v := range []struct {
		name  string
		apply func(c *config.Config)
	}{
		{"ddp naive", func(c *config.Config) { c.DDP.Mode = "naive" }},
		{"ddp bucketed", func(c *config.Config) { c.DDP.Mode, c.DDP.BucketMB, c.DDP.FirstBucketMB = "bucketed", 0.02, 0.01 }},
		{"zero 1", func(c *config.Config) { c.Zero.Stage = 1 }},
	} {
		for _, s := range []string{"1f1b", "zb1"} {
			cfg := base64(4, 2)
			cfg.Parallel.PP, cfg.PP.Schedule = 2, s
			v.apply(&cfg)
			run(t, cfg, 4, "local", fmt.Sprintf("pp 2 × dp 2 %s %s", v.name, s))
		}
	}
}

// TestEquivalenceTCP: a subset over the tcp backend.
func TestEquivalenceTCP(t *testing.T) {
	for _, s := range []string{"1f1b", "zb1"} {
		cfg := base64(4, 4)
		cfg.Parallel.PP, cfg.PP.Schedule = 2, s
		run(t, cfg, 2, "tcp", "tcp pp 2 "+s)
	}
	cfg := base64(4, 2)
	cfg.Parallel.PP = 2
	cfg.DDP.BucketMB, cfg.DDP.FirstBucketMB = 0.02, 0.01
	run(t, cfg, 4, "tcp", "tcp pp 2 × dp 2 ddp")
}

// TestEquivalenceProcesses: pp 2 as real processes, built from the config
// as `tinyacc train --nproc 2` builds it.
func TestEquivalenceProcesses(t *testing.T) {
	for _, s := range []string{"1f1b", "zb1"} {
		cfg := base64(4, 2)
		cfg.Parallel.PP, cfg.PP.Schedule = 2, s
		want := ptest.Single(t, single(cfg, 2))
		got := ptest.Processes(t, "pp2-"+s, cfg, 2, build(cfg))
		if got == nil {
			continue // this process is a rank of the other run
		}
		ptest.Check(t, want, got, "processes pp 2 "+s)
		require.Equal(t, got[0].Local["wte.weight"], got[1].Local["wte.weight"])
	}
}
