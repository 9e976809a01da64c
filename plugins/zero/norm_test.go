package zero

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// rankRun is what runRanks keeps of one rank.
type rankRun struct {
	Result *trainer.Result
	Steps  []trainer.StepMetrics // every step's metrics, from Options.OnStep
	Evals  []trainer.EvalPoint   // every evaluation, from Options.OnEval
	Memory trainer.MemoryReport  // the rank's own report
}

// runRanks trains cfg on n local ranks with ZeRO stage and returns every
// rank's full result (ptest keeps only the losses; the gradient norm is
// what clipping and the logs depend on, and the gathered memory reports
// are in the result).
func runRanks(t *testing.T, cfg config.Config, n, stage int) []rankRun {
	return runRanksWith(t, cfg, n, stage, trainer.Options{Train: ptest.Corpus()})
}

// runRanksWith is runRanks with the data (and any other options) of base.
func runRanksWith(t *testing.T, cfg config.Config, n, stage int, base trainer.Options) []rankRun {
	out := make([]rankRun, n)
	var mu sync.Mutex
	err := comm.RunLocal(n, comm.Options{}, func(g comm.Group) error {
		ps, m, err := build(stage)(g)
		if err != nil {
			return err
		}
		opts := base
		opts.Plugins, opts.Mesh, opts.Rank, opts.World = ps, m, g.Rank(), g.Size()
		var steps []trainer.StepMetrics
		var evals []trainer.EvalPoint
		opts.OnStep = func(m trainer.StepMetrics) { steps = append(steps, m) }
		opts.OnEval = func(e trainer.EvalPoint) { evals = append(evals, e) }
		tr, err := trainer.New(cfg, opts)
		if err != nil {
			return err
		}
		res, err := tr.Run(context.Background())
		if err != nil {
			return err
		}
		mu.Lock()
		out[g.Rank()] = rankRun{Result: res, Steps: steps, Evals: evals, Memory: tr.Memory()}
		mu.Unlock()
		return nil
	})
	require.NoError(t, err)
	return out
}

func singleSteps(t *testing.T, cfg config.Config) []trainer.StepMetrics {
	var steps []trainer.StepMetrics
	tr, err := trainer.New(cfg, trainer.Options{Train: ptest.Corpus(), OnStep: func(m trainer.StepMetrics) { steps = append(steps, m) }})
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.NoError(t, err)
	return steps
}

// TestGradNormMatchesSingle holds the global gradient norm every rank
// reports (and clips with) to the single-process one, step by step. The
// losses alone would not catch a wrong gradient scale: clipping and AdamW
// both normalise it away.
func TestGradNormMatchesSingle(t *testing.T) {
	for _, stage := range []int{1, 2, 3} {
		for _, accum := range []int{1, 2} {
			t.Run(fmt.Sprintf("stage%d/accum%d", stage, accum), func(t *testing.T) {
				const n = 2
				cfg := parallelConfig(stage, n, accum)
				cfg.Train.Steps = 4
				ref := cfg
				ref.Train.BatchSize *= n
				want := singleSteps(t, ref)
				for r, run := range runRanks(t, cfg, n, stage) {
					steps := run.Steps
					require.Len(t, steps, len(want))
					for s := range want {
						require.Greater(t, want[s].GradNorm, cfg.Train.GradClip, "the reference must clip for this test to bite")
						require.InEpsilon(t, want[s].GradNorm, steps[s].GradNorm, 1e-5, "rank %d step %d", r, s)
					}
				}
			})
		}
	}
}

// TestSGDWithoutClipping trains with plain SGD and no clipping, where the
// update is proportional to the gradient: averaging over ranks and
// summing over micro-batches must give exactly the single-process scale.
func TestSGDWithoutClipping(t *testing.T) {
	for _, stage := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("stage%d", stage), func(t *testing.T) {
			const n, accum = 2, 2
			cfg := parallelConfig(stage, n, accum)
			cfg.Train.Optimizer, cfg.Train.GradClip, cfg.Train.LR = "sgd", 0, 0.05
			ref := cfg
			ref.Train.BatchSize *= n
			want := ptest.Single(t, ref)
			rs := ptest.Parallel(t, cfg, n, "local", build(stage))
			for r, got := range rs {
				ptest.AssertEquivalent(t, want, got, fmt.Sprintf("sgd stage %d rank %d", stage, r))
			}
		})
	}
}

// TestEvaluationBetweenSteps evaluates between steps: a forward without
// backward, which in stage 3 gathers units that no backward releases. The
// ranks split each evaluation batch as they split a training batch, so
// every stage's validation losses are one process's on the same global
// batch, and training after the evaluations must still match it.
func TestEvaluationBetweenSteps(t *testing.T) {
	c := ptest.Corpus()
	split := len(c) * 8 / 10
	data := trainer.Options{Train: c[:split], Val: c[split:]}
	const n = 2
	cfg := func(stage int) config.Config {
		cfg := parallelConfig(stage, n, 1)
		cfg.Train.Steps, cfg.Train.EvalEvery = 4, 2
		return cfg
	}
	ref := cfg(1)
	ref.Train.BatchSize *= n
	var single []trainer.StepMetrics
	var want []trainer.EvalPoint
	refOpts := data
	refOpts.OnStep = func(m trainer.StepMetrics) { single = append(single, m) }
	refOpts.OnEval = func(e trainer.EvalPoint) { want = append(want, e) }
	tr, err := trainer.New(ref, refOpts)
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.NoError(t, err)
	require.Len(t, want, 2)
	for _, stage := range []int{1, 2, 3} {
		for r, run := range runRanksWith(t, cfg(stage), n, stage, data) {
			require.Len(t, run.Evals, 2)
			for i := range want {
				require.InEpsilon(t, want[i].Loss, run.Evals[i].Loss, 1e-5, "stage %d rank %d eval %d", stage, r, i)
			}
			for s := range single {
				require.InEpsilon(t, single[s].Loss, run.Steps[s].Loss, 1e-5, "stage %d rank %d step %d", stage, r, s)
			}
		}
	}
}
