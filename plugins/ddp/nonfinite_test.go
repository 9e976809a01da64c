package ddp_test

import (
	"context"
	"math"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ddp"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// nanOnce puts a NaN into one weight of one rank before the forward of one
// step and restores the weight after that step: the rank's gradients turn
// NaN, and the all-reduce carries them to every rank.
type nanOnce struct {
	rank, step, at int
	saved          float32
}

func (p *nanOnce) Name() string { return "nan-once" }

func (p *nanOnce) PreForward(t *trainer.Trainer, info tensor.PassInfo) error {
	if t.Rank == p.rank && p.at == p.step {
		w := t.Model.Param("h.0.mlp.c_fc.weight").F32()
		p.saved, w[7] = w[7], float32(math.NaN())
	}
	return nil
}

func (p *nanOnce) PostStep(t *trainer.Trainer, m *trainer.StepMetrics) error {
	if t.Rank == p.rank && p.at == p.step {
		t.Model.Param("h.0.mlp.c_fc.weight").F32()[7] = p.saved
	}
	p.at++
	return nil
}

// Under train.nonfinite=skip a NaN on one rank skips the step on every
// rank (the loss is averaged and the norm is global), and training goes on
// with the replicas identical.
func TestNonFiniteSkipOnEveryRank(t *testing.T) {
	cfg := ptest.Config()
	cfg.Train.Steps, cfg.Train.NonFinite = 5, "skip"
	const n = 2
	steps := make([][]trainer.StepMetrics, n)
	params := make([][]float32, n)
	var mu sync.Mutex
	err := comm.RunLocal(n, comm.Options{}, func(g comm.Group) error {
		d, err := ddp.New(g, ddp.Bucketed, 25, 1)
		if err != nil {
			return err
		}
		var mine []trainer.StepMetrics
		tr, err := trainer.New(cfg, trainer.Options{Train: ptest.Corpus(), Rank: g.Rank(), World: n,
			Plugins: []trainer.Plugin{d, &nanOnce{rank: 1, step: 2}},
			OnStep:  func(m trainer.StepMetrics) { mine = append(mine, m) }})
		if err != nil {
			return err
		}
		if _, err := tr.Run(context.Background()); err != nil {
			return err
		}
		mu.Lock()
		steps[g.Rank()], params[g.Rank()] = mine, slices.Clone(tr.Model.Param("h.0.mlp.c_fc.weight").F32())
		mu.Unlock()
		return nil
	})
	require.NoError(t, err)
	for r := 0; r < n; r++ {
		require.Len(t, steps[r], 5)
		for s, m := range steps[r] {
			require.Equal(t, s == 2, m.Skipped, "rank %d step %d", r, s)
			require.Equal(t, s == 2, math.IsNaN(m.Loss), "rank %d step %d", r, s)
			if s != 2 {
				require.Equal(t, steps[0][s].Loss, m.Loss, "rank %d step %d", r, s)
			}
		}
	}
	require.Equal(t, params[0], params[1], "the replicas stay identical")
}
