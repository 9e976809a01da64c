package plugins

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// evalGlobal is the global batch of the evaluation layouts: every layout
// splits 8 sequences per step, and per evaluation batch, its own way.
const evalGlobal = 8

// evalLayouts cut the same global batch over data-parallel ranks,
// micro-batches, tensor, pipeline and context parallel ranks.
var evalLayouts = []struct {
	name         string
	ranks, accum int
	apply        func(c *config.Config)
}{
	{"1 process, grad_accum 2", 1, 2, func(c *config.Config) {}},
	{"dp2", 2, 1, func(c *config.Config) {}},
	{"dp2 grad_accum 2", 2, 2, func(c *config.Config) {}},
	{"zero3 dp2", 2, 1, func(c *config.Config) { c.Zero.Stage = 3 }},
	{"dp2 x tp2", 4, 1, func(c *config.Config) { c.Parallel.TP = 2 }},
	{"pp2 grad_accum 2", 2, 2, func(c *config.Config) { c.Parallel.PP = 2 }},
	{"pp2 interleaved v2 grad_accum 2", 2, 2, func(c *config.Config) { c.Parallel.PP, c.PP.Schedule, c.PP.VirtualStages = 2, "interleaved", 2 }},
	{"pp2 x dp2 grad_accum 2", 4, 2, func(c *config.Config) { c.Parallel.PP, c.Zero.Stage = 2, 1 }},
	{"cp2", 2, 1, func(c *config.Config) { c.Parallel.CP = 2 }},
	{"dp2 x cp2", 4, 1, func(c *config.Config) { c.Parallel.CP = 2 }},
	{"tp2 sequence parallel", 2, 1, func(c *config.Config) { c.Parallel.TP, c.TP.SequenceParallel = 2, true }},
	{"zero2 dp2 x cp2 x tp2", 8, 1, func(c *config.Config) { c.Zero.Stage, c.Parallel.CP, c.Parallel.TP = 2, 2, 2 }},
}

// evalConfig trains 4 steps of evalGlobal sequences and evaluates after
// steps 2 and 4 on 2 batches; 4 layers make 4 chunks of one block for an
// interleaved pipeline.
func evalConfig() config.Config {
	c := ptest.Config()
	c.Model.NLayer = 4
	c.Train.Steps, c.Train.EvalEvery, c.Train.EvalBatches, c.Data.ValFraction = 4, 2, 2, 0.2
	c.Train.BatchSize = evalGlobal
	return c
}

// runEvals trains cfg on n ranks (goroutines; 1: one process) and returns
// every rank's validation losses.
func runEvals(t *testing.T, cfg config.Config, n int) [][]trainer.EvalPoint {
	c := ptest.Corpus()
	cut := len(c) - int(math.Floor(float64(len(c))*cfg.Data.ValFraction))
	out := make([][]trainer.EvalPoint, n)
	var mu sync.Mutex
	train := func(g comm.Group) error {
		var evals []trainer.EvalPoint
		opts := trainer.Options{Train: c[:cut], Val: c[cut:], OnEval: func(e trainer.EvalPoint) { evals = append(evals, e) }}
		if g != nil {
			ps, m, err := Build(cfg, g)
			if err != nil {
				return err
			}
			opts.Plugins, opts.Mesh, opts.Rank, opts.World = ps, m, g.Rank(), g.Size()
		}
		tr, err := trainer.New(cfg, opts)
		if err != nil {
			return err
		}
		res, err := tr.Run(context.Background())
		if err != nil {
			return err
		}
		if len(evals) == 0 || res.LastEval != evals[len(evals)-1] {
			return fmt.Errorf("rank %d: the result's last evaluation %+v is not the last one OnEval received (%+v)", opts.Rank, res.LastEval, evals)
		}
		mu.Lock()
		out[opts.Rank] = evals
		mu.Unlock()
		return nil
	}
	if n == 1 {
		require.NoError(t, train(nil))
	} else {
		require.NoError(t, comm.RunLocal(n, comm.Options{}, train))
	}
	return out
}

// TestEvaluationEqualsOneProcess: every layout splits each global
// evaluation batch as it splits a training batch and averages the ranks'
// losses, so every rank of every layout, every pipeline stage included,
// reports one process's validation losses on the same global batch (fp32:
// 1e-5 relative).
func TestEvaluationEqualsOneProcess(t *testing.T) {
	want := runEvals(t, evalConfig(), 1)[0]
	require.Len(t, want, 2)
	for _, l := range evalLayouts {
		cfg := evalConfig()
		l.apply(&cfg)
		dp := l.ranks / (cfg.Parallel.PP * cfg.Parallel.TP * cfg.Parallel.CP)
		cfg.Train.GradAccum, cfg.Train.BatchSize = l.accum, evalGlobal/(dp*l.accum)
		for r, got := range runEvals(t, cfg, l.ranks) {
			require.Len(t, got, len(want), "%s rank %d", l.name, r)
			for i := range want {
				require.Equal(t, want[i].Step, got[i].Step, "%s rank %d", l.name, r)
				require.InEpsilon(t, want[i].Loss, got[i].Loss, 1e-5, "%s rank %d: evaluation after step %d", l.name, r, want[i].Step)
			}
		}
	}
}
