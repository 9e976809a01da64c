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
