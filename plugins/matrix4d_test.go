package plugins

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// The 4D matrix: every composition of data, tensor, pipeline and context
// parallel built by Build trains like one process on the same global batch,
// in float64 (losses and weights 1e-9) on ptest's float64 model; short
// runs (2 steps of 2 micro-batches) keep the 16-rank rows inside the test
// budget.

// matrixConfig is the run every row splits: a global batch of 4 sequences
// per micro-batch, 2 micro-batches, 2 steps.
func matrixConfig() config.Config {
	c := ptest.Config64()
	c.Train.Steps, c.Train.BatchSize, c.Train.GradAccum = 2, 4, 2
	return c
}

// shape4 is one layout of the mesh.
type shape4 struct{ dp, tp, pp, cp int }

func (s shape4) ranks() int { return s.dp * s.tp * s.pp * s.cp }

func (s shape4) String() string {
	return fmt.Sprintf("dp%d tp%d pp%d cp%d", s.dp, s.tp, s.pp, s.cp)
}

// apply lays cfg out as s: the data-parallel ranks split the batch.
func (s shape4) apply(c *config.Config) {
	c.Parallel.DP, c.Parallel.TP, c.Parallel.PP, c.Parallel.CP = s.dp, s.tp, s.pp, s.cp
	c.Train.BatchSize /= s.dp
}

func runMatrixRow(t *testing.T, want ptest.Result, cfg config.Config, n int, what string) {
	t.Helper()
	require.NoError(t, cfg.Validate(), what)
	got := ptest.Parallel(t, cfg, n, "local", func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) { return Build(cfg, g) })
	ptest.Check(t, want, got, what)
}

// TestMatrix4D: the 16 compositions of dp, tp, pp, cp in {1, 2} with
// bucketed DDP and the 1f1b schedule; then the full 4D mesh (16 ranks)
// with each ZeRO stage that composes with a pipeline (stage 1: stages 2
// and 3 reduce gradients during backward, which a pipeline's
// micro-batches would repeat) and with each pipeline schedule once,
// sequence parallel and the all-gather attention included.
func TestMatrix4D(t *testing.T) {
	base := matrixConfig()
	want := ptest.Single(t, base)
	for _, dp := range []int{1, 2} {
		for _, tp := range []int{1, 2} {
			for _, pp := range []int{1, 2} {
				for _, cp := range []int{1, 2} {
					s := shape4{dp, tp, pp, cp}
					if s.ranks() == 1 {
						continue // the reference itself
					}
					cfg := base
					s.apply(&cfg)
					runMatrixRow(t, want, cfg, s.ranks(), s.String()+" ddp 1f1b")
				}
			}
		}
	}
	full := shape4{2, 2, 2, 2}
	for _, row := range []struct {
		name  string
		apply func(c *config.Config)
	}{
		{"zero1 1f1b", func(c *config.Config) { c.Zero.Stage = 1 }},
		{"ddp afab", func(c *config.Config) { c.PP.Schedule = "afab" }},
		{"ddp interleaved", func(c *config.Config) { c.PP.Schedule, c.PP.VirtualStages = "interleaved", 2 }},
		{"ddp zb1 + SP, allgather contiguous", func(c *config.Config) {
			c.PP.Schedule, c.TP.SequenceParallel, c.CP.Attention, c.CP.Split = "zb1", true, "allgather", "contiguous"
		}},
	} {
		cfg := base
		full.apply(&cfg)
		row.apply(&cfg)
		runMatrixRow(t, want, cfg, full.ranks(), full.String()+" "+row.name)
	}
}

// TestMatrix4DProcesses runs a subset of the matrix as real processes
// over tcp: cp with each of the other dimensions. These rows keep float32
// on a model small enough for its bounds (ptest.Float32Bounds): n_embd
// 16, 2 layers.
func TestMatrix4DProcesses(t *testing.T) {
	base := ptest.Config()
	base.Model.NLayer, base.Model.NHead, base.Model.NEmbd, base.Model.BlockSize = 2, 2, 16, 16
	base.Train.Steps, base.Train.BatchSize, base.Train.GradAccum = 2, 4, 2
	want := ptest.Single(t, base)
	for _, s := range []shape4{{2, 1, 1, 2}, {1, 2, 1, 2}, {1, 1, 2, 2}} {
		cfg := base
		s.apply(&cfg)
		got := ptest.Processes(t, s.String(), cfg, s.ranks(), func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) { return Build(cfg, g) })
		if got == nil {
			continue // this process is a rank of another layout's run
		}
		ptest.Check(t, want, got, s.String()+", processes")
	}
}

// oneProcess is the single-process run of layout c: the same global batch
// (the data-parallel ranks' micro-batches together), split into the same
// micro-batches.
func oneProcess(c config.Config) config.Config {
	s := c
	s.Parallel.DP, s.Parallel.TP, s.Parallel.PP, s.Parallel.CP = 1, 1, 1, 1
	s.PP.Layers, s.PP.VirtualStages, s.PP.Schedule = "", 1, "1f1b"
	s.TP.SequenceParallel, s.Zero.Stage = false, 0
	s.Train.BatchSize = c.Train.BatchSize * max(c.Parallel.DP, 1)
	return s
}

// TestMatrixCompositions completes the matrix in float64, each row against
// one process on its global batch: ZeRO-2 and 3 under tp × cp, cp 3 in
// training, tp 4 × cp 2, pipelines of 3 and 4 stages with tp and with cp,
// uneven pipeline splits under tp with sequence parallel and cp, the
// interleaved schedule with cp, and ZeRO-2 × cp with accumulation.
func TestMatrixCompositions(t *testing.T) {
	for _, row := range []struct {
		name  string
		apply func(c *config.Config)
	}{
		{"dp2 tp2 cp2 zero2", func(c *config.Config) { c.Parallel.DP, c.Parallel.TP, c.Parallel.CP, c.Zero.Stage = 2, 2, 2, 2 }},
		{"dp2 tp2 sp cp2 zero3", func(c *config.Config) {
			c.Parallel.DP, c.Parallel.TP, c.TP.SequenceParallel, c.Parallel.CP, c.Zero.Stage = 2, 2, true, 2, 3
		}},
		{"cp3 ring zigzag", func(c *config.Config) { c.Parallel.CP, c.Model.BlockSize = 3, 12 }},
		{"cp3 allgather contiguous, dp2", func(c *config.Config) {
			c.Parallel.DP, c.Parallel.CP, c.CP.Attention, c.CP.Split, c.Model.BlockSize = 2, 3, "allgather", "contiguous", 12
		}},
		{"tp4 cp2", func(c *config.Config) { c.Parallel.TP, c.Parallel.CP = 4, 2 }},
		{"tp4 sp cp2 allgather", func(c *config.Config) {
			c.Parallel.TP, c.TP.SequenceParallel, c.Parallel.CP, c.CP.Attention = 4, true, 2, "allgather"
		}},
		{"pp3 tp2 1f1b", func(c *config.Config) { c.Parallel.PP, c.Parallel.TP, c.Train.GradAccum = 3, 2, 3 }},
		{"pp3 cp2 zb1", func(c *config.Config) {
			c.Parallel.PP, c.Parallel.CP, c.PP.Schedule, c.Train.GradAccum = 3, 2, "zb1", 3
		}},
		{"pp4 tp2 sp afab", func(c *config.Config) {
			c.Parallel.PP, c.Parallel.TP, c.TP.SequenceParallel, c.PP.Schedule, c.Train.GradAccum = 4, 2, true, "afab", 4
		}},
		{"pp4 cp2 1f1b", func(c *config.Config) { c.Parallel.PP, c.Parallel.CP, c.Train.GradAccum = 4, 2, 4 }},
		{"pp2 layers 3,1 tp2 sp cp2", func(c *config.Config) {
			c.Parallel.PP, c.PP.Layers, c.Parallel.TP, c.TP.SequenceParallel, c.Parallel.CP = 2, "3,1", 2, true, 2
		}},
		{"pp2 layers 1,3 zb1 tp2 cp2 dp2", func(c *config.Config) {
			c.Parallel.PP, c.PP.Layers, c.PP.Schedule, c.Parallel.TP, c.Parallel.CP, c.Parallel.DP = 2, "1,3", "zb1", 2, 2, 2
		}},
		{"pp2 interleaved cp2", func(c *config.Config) {
			c.Parallel.PP, c.PP.Schedule, c.PP.VirtualStages, c.Parallel.CP = 2, "interleaved", 2, 2
		}},
		{"pp2 interleaved cp2 allgather contiguous, dp2", func(c *config.Config) {
			c.Parallel.PP, c.PP.Schedule, c.PP.VirtualStages, c.Parallel.CP, c.Parallel.DP = 2, "interleaved", 2, 2, 2
			c.CP.Attention, c.CP.Split = "allgather", "contiguous"
		}},
		{"dp2 cp2 zero2 accum 4", func(c *config.Config) { c.Parallel.DP, c.Parallel.CP, c.Zero.Stage, c.Train.GradAccum = 2, 2, 2, 4 }},
		{"dp2 cp2 zero3 accum 4", func(c *config.Config) { c.Parallel.DP, c.Parallel.CP, c.Zero.Stage, c.Train.GradAccum = 2, 2, 3, 4 }},
	} {
		cfg := matrixConfig()
		cfg.Train.BatchSize = 2 // per data-parallel rank and micro-batch
		cfg.Parallel.DP = 1
		row.apply(&cfg)
		want := ptest.Single(t, oneProcess(cfg))
		n := cfg.Parallel.DP * cfg.Parallel.TP * cfg.Parallel.PP * cfg.Parallel.CP
		runMatrixRow(t, want, cfg, n, fmt.Sprintf("%s (%d ranks)", row.name, n))
	}
}
