package plugins

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/cp"
	"github.com/tinyacc/tinyacc/plugins/ddp"
	"github.com/tinyacc/tinyacc/plugins/pp"
	"github.com/tinyacc/tinyacc/plugins/ptest"
	"github.com/tinyacc/tinyacc/plugins/zero"
)

type variant struct {
	name  string
	apply func(c *config.Config)
}

var variants = []variant{
	{"ddp naive", func(c *config.Config) { c.DDP.Mode = "naive" }},
	{"ddp bucketed", func(c *config.Config) { c.DDP.Mode, c.DDP.BucketMB, c.DDP.FirstBucketMB = "bucketed", 0.02, 0.01 }},
	{"zero 1", func(c *config.Config) { c.Zero.Stage = 1 }},
	{"zero 2", func(c *config.Config) { c.Zero.Stage = 2 }},
	{"zero 3", func(c *config.Config) { c.Zero.Stage = 3 }},
}

// TestEquivalenceMatrix is the law for every data-parallel plugin, built
// the way `tinyacc train` builds it: N ranks with a per-rank batch B give
// the single process with batch N·B, on both backends, with and without
// gradient accumulation, in float64 (1e-9).
func TestEquivalenceMatrix(t *testing.T) {
	for _, accum := range []int{1, 2} {
		for _, n := range []int{2, 4} {
			single := ptest.Config64()
			single.Train.GradAccum = accum
			single.Train.BatchSize = n
			want := ptest.Single(t, single)
			for _, v := range variants {
				for _, backend := range []string{"local", "tcp"} {
					cfg := single
					cfg.Train.BatchSize = 1
					v.apply(&cfg)
					what := fmt.Sprintf("%s, %s, N=%d, grad_accum=%d", v.name, backend, n, accum)
					got := ptest.Parallel(t, cfg, n, backend, func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) {
						return Build(cfg, g)
					})
					ptest.Check(t, want, got, what)
				}
			}
		}
	}
}

func TestBuildPicksThePlugin(t *testing.T) {
	require.NoError(t, comm.RunLocal(2, comm.Options{}, func(g comm.Group) error {
		cfg := config.Defaults()
		ps, m, err := Build(cfg, g)
		require.NoError(t, err)
		require.IsType(t, &ddp.DDP{}, ps[0])
		require.Equal(t, 2, m.DP().Size())
		cfg.Zero.Stage = 2
		ps, _, err = Build(cfg, g)
		require.NoError(t, err)
		require.IsType(t, &zero.Zero{}, ps[0])
		require.Equal(t, 2, ps[0].(*zero.Zero).Stage())
		cfg.Parallel.DP = 3
		_, _, err = Build(cfg, g)
		require.EqualError(t, err, "mesh: world size 2 != tp 1 × cp 1 × dp 3 × pp 1 = 3")
		return nil
	}))
	ps, m, err := Build(config.Defaults(), nil)
	require.NoError(t, err)
	require.Empty(t, ps, "a single process needs no plugin")
	require.Nil(t, m)
}

// ZeRO-3 holds only shards of the parameters: saving gathers them first,
// and the file must hold what a single process trains (the run itself is
// held to one process too).
func TestZero3SavesFullWeights(t *testing.T) {
	single := ptest.Config64()
	want := ptest.Single(t, single)
	cfg := single
	cfg.Train.BatchSize = 2
	cfg.Zero.Stage = 3
	cfg.SaveTo = filepath.Join(t.TempDir(), "z3.safetensors")
	got := ptest.Parallel(t, cfg, 2, "local", func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) { return Build(cfg, g) })
	ptest.Check(t, want, got, "zero-3")
	ptest.AssertParams(t, want.Params, ptest.LoadParams(t, cfg.SaveTo), "zero-3 saved weights", ptest.Float64Bounds)
}

// Goroutine ranks share the process's kernel threads and BLAS library;
// their results must still not depend on how they interleave.
func TestLocalRanksAreBitwiseReproducible(t *testing.T) {
	cfg := ptest.Config()
	cfg.Model.NEmbd, cfg.Model.BlockSize, cfg.Model.NHead = 128, 64, 4
	cfg.Train.Steps, cfg.Train.BatchSize = 3, 8
	build := func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) { return Build(cfg, g) }
	first := ptest.Parallel(t, cfg, 2, "local", build)
	for i := 0; i < 3; i++ {
		again := ptest.Parallel(t, cfg, 2, "local", build)
		require.Equal(t, first[0].Losses, again[0].Losses)
		for name, w := range first[0].Params {
			require.Equal(t, w, again[0].Params[name], "run %d: %s", i+2, name)
		}
	}
}

// TestEquivalenceProcesses runs layouts of the matrix as real processes
// (this test binary, once per rank, over tcp), built by Build from the
// config as `tinyacc train --nproc` does.
func TestEquivalenceProcesses(t *testing.T) {
	single := ptest.Config()
	single.Train.Steps = 4
	want := ptest.Single(t, single)
	for _, v := range []variant{variants[1], variants[4]} {
		cfg := ptest.Config()
		cfg.Train.Steps = 4
		cfg.Train.BatchSize = 2
		v.apply(&cfg)
		got := ptest.Processes(t, v.name, cfg, 2, func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) { return Build(cfg, g) })
		if got == nil {
			continue // this process is a rank of another layout's run
		}
		// float32 on ptest's small model: the attention key bias, whose
		// gradient is zero in theory, takes AdamW steps from rounding noise
		// and lands at ~1e-4 of its tensor; it is allowed 1e-3 here.
		b := ptest.Float32Bounds
		b.Wider = map[string]float64{".attn.c_attn.bias": 1e-3}
		ptest.CheckWithin(t, want, got, v.name+", processes", b)
	}
}

// TestBuildPipeline: the step owner comes before data parallel, and a
// schedule the checker or the split refuses stops Build on every rank.
func TestBuildPipeline(t *testing.T) {
	require.NoError(t, comm.RunLocal(4, comm.Options{}, func(g comm.Group) error {
		cfg := ptest.Config()
		cfg.Parallel.PP = 2
		ps, m, err := Build(cfg, g)
		require.NoError(t, err)
		require.Len(t, ps, 2)
		require.IsType(t, &pp.Pipeline{}, ps[0])
		require.IsType(t, &ddp.DDP{}, ps[1])
		require.Equal(t, 2, m.PP().Size())
		require.Equal(t, 2, m.DP().Size())
		require.Equal(t, []int{1, 1}, ps[0].(*pp.Pipeline).Split())
		cfg.Model.NLayer = 1
		_, _, err = Build(cfg, g)
		require.EqualError(t, err, "pp: 2 model chunks cannot split 1 blocks: every chunk needs at least one")
		cfg.Model.NLayer, cfg.PP.Schedule, cfg.Train.GradAccum = 2, "interleaved", 3
		_, _, err = Build(cfg, g)
		require.EqualError(t, err, "pp: the interleaved schedule needs train.grad_accum (micro-batches, 3) to be a multiple of parallel.pp (2)")
		return nil
	}))
}

// TestEquivalencePipelineLayouts: pipeline layouts built by Build, beside
// the data-parallel matrix: pp 2 and pp 2 × dp 2 with ZeRO-1, against one
// process on the same global batch, in float64.
func TestEquivalencePipelineLayouts(t *testing.T) {
	single := ptest.Config64()
	single.Train.GradAccum, single.Train.BatchSize = 2, 4
	want := ptest.Single(t, single)
	for _, l := range []struct {
		name  string
		n, dp int
		apply func(c *config.Config)
	}{
		{"pp 2", 2, 1, func(c *config.Config) {}},
		{"pp 2 zb1 × dp 2 zero1", 4, 2, func(c *config.Config) { c.PP.Schedule, c.Zero.Stage = "zb1", 1 }},
		{"pp 2 × tp 2 + SP", 4, 1, func(c *config.Config) { c.Parallel.TP, c.TP.SequenceParallel = 2, true }},
	} {
		cfg := single
		cfg.Parallel.PP = 2
		cfg.Train.BatchSize = 4 / l.dp
		l.apply(&cfg)
		got := ptest.Parallel(t, cfg, l.n, "local", func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) { return Build(cfg, g) })
		ptest.Check(t, want, got, l.name)
	}
}

// TestEquivalenceContextParallel: context-parallel layouts built by Build
// train like one process on the same global batch (float64, 1e-9): cp 2
// and 4, ring and all-gather attention, zigzag and contiguous splits, and
// cp 2 beside dp 2, tp 2 (with sequence parallel) and pp 2. The CP ranks
// of a group read the same sequences, each its chunks.
func TestEquivalenceContextParallel(t *testing.T) {
	base := ptest.Config64()
	want := ptest.Single(t, base)
	type row struct {
		name  string
		n     int
		apply func(c *config.Config)
	}
	var rows []row
	for _, n := range []int{2, 4} {
		for _, att := range []string{"ring", "allgather"} {
			for _, split := range []string{"zigzag", "contiguous"} {
				rows = append(rows, row{fmt.Sprintf("cp %d %s %s", n, att, split), n, func(c *config.Config) {
					c.Parallel.CP, c.CP.Attention, c.CP.Split = n, att, split
				}})
			}
		}
	}
	rows = append(rows,
		row{"cp 2 × dp 2", 4, func(c *config.Config) { c.Parallel.CP, c.Train.BatchSize = 2, 2 }},
		row{"cp 2 × dp 2 zero 2", 4, func(c *config.Config) { c.Parallel.CP, c.Train.BatchSize, c.Zero.Stage = 2, 2, 2 }},
		row{"cp 2 × dp 2 zero 3", 4, func(c *config.Config) { c.Parallel.CP, c.Train.BatchSize, c.Zero.Stage = 2, 2, 3 }},
		row{"cp 2 × tp 2 + SP", 4, func(c *config.Config) { c.Parallel.CP, c.Parallel.TP, c.TP.SequenceParallel = 2, 2, true }},
		row{"cp 2 × pp 2", 4, func(c *config.Config) {
			c.Parallel.CP, c.Parallel.PP, c.Train.GradAccum, c.Train.BatchSize = 2, 2, 2, 2
		}},
	)
	for _, l := range rows {
		cfg := base
		l.apply(&cfg)
		require.NoError(t, cfg.Validate(), l.name)
		got := ptest.Parallel(t, cfg, l.n, "local", func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) { return Build(cfg, g) })
		ptest.Check(t, want, got, l.name)
	}
}

// TestBuildContextParallel: cp comes after tp and before data parallel;
// plain DDP reduces over DP × CP and reads data by DP rank, while ZeRO
// leaves the CP average to the cp plugin.
func TestBuildContextParallel(t *testing.T) {
	require.NoError(t, comm.RunLocal(4, comm.Options{}, func(g comm.Group) error {
		cfg := ptest.Config()
		cfg.Parallel.CP = 2
		ps, m, err := Build(cfg, g)
		require.NoError(t, err)
		require.Len(t, ps, 2)
		require.IsType(t, &cp.CP{}, ps[0])
		require.False(t, ps[0].(*cp.CP).ReduceGrads)
		require.IsType(t, &ddp.DDP{}, ps[1])
		require.Equal(t, m.DP(), ps[1].(*ddp.DDP).Data)
		require.Equal(t, 2, m.CP().Size())
		cfg.Zero.Stage = 1
		ps, _, err = Build(cfg, g)
		require.NoError(t, err)
		require.True(t, ps[0].(*cp.CP).ReduceGrads)
		return nil
	}))
}

// TestContextParallelEvaluation: evaluation under cp 2 (each rank its
// chunks of the same batches) reports one process's validation loss.
func TestContextParallelEvaluation(t *testing.T) {
	cfg := ptest.Config()
	cfg.Train.Steps, cfg.Data.ValFraction, cfg.Train.EvalBatches = 2, 0.2, 2
	var single [1]float64
	ptest.Parallel(t, cfg, 1, "local", func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) {
		return []trainer.Plugin{evalProbe{&single[0]}}, nil, nil
	})
	cfg.Parallel.CP = 2
	var evals [2]float64
	ptest.Parallel(t, cfg, 2, "local", func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) {
		ps, m, err := Build(cfg, g)
		return append(ps, evalProbe{&evals[g.Rank()]}), m, err
	})
	for r, got := range evals {
		require.InEpsilon(t, single[0], got, 1e-5, "rank %d's evaluation", r)
	}
}
