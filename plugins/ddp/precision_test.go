package ddp_test

import (
	"context"
	"maps"
	"math"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ddp"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// overflowOnce puts an infinity into one gradient element of one rank after
// the gradients were reduced (its PreStep runs after DDP's), as an fp16
// overflow there would, and records, per step, whether the weights or the
// optimizer moments changed (bitwise) across the update.
type overflowOnce struct {
	rank, step, at int
	before         map[string][]float32
	changed        []bool
}

func (p *overflowOnce) Name() string { return "overflow-once" }

// snapshot is every parameter and every optimizer buffer of the rank.
func snapshot(t *trainer.Trainer) map[string][]float32 {
	out := map[string][]float32{}
	for _, w := range t.Model.Params() {
		out["param "+w.Name] = slices.Clone(w.F32())
	}
	for k, b := range t.Opt.State() {
		out["state "+k] = slices.Clone(b.F32())
	}
	return out
}

func (p *overflowOnce) PreStep(t *trainer.Trainer) error {
	p.before = snapshot(t)
	if t.Rank == p.rank && p.at == p.step {
		t.Model.Param("h.1.attn.c_proj.weight").Grad.F32()[5] = float32(math.Inf(1))
	}
	return nil
}

func (p *overflowOnce) PostStep(t *trainer.Trainer, m *trainer.StepMetrics) error {
	after := snapshot(t)
	p.changed = append(p.changed, !maps.EqualFunc(p.before, after, slices.Equal[[]float32]))
	p.at++
	return nil
}

// Under fp16 dynamic loss scaling an overflow on one rank skips the step on
// every rank, with weights and AdamW moments bitwise unchanged, halves the
// scale, and loss_scale_window good steps double it again.
func TestFP16OverflowSkipsOnEveryRank(t *testing.T) {
	cfg := ptest.Config()
	cfg.Train.Steps, cfg.Train.MixedPrecision, cfg.Train.LossScaleWindow = 6, "fp16", 2
	const n = 2
	steps := make([][]trainer.StepMetrics, n)
	hooks := make([]*overflowOnce, n)
	params := make([][]float32, n)
	var mu sync.Mutex
	err := comm.RunLocal(n, comm.Options{}, func(g comm.Group) error {
		d, err := ddp.New(g, ddp.Bucketed, 25, 1) // the world is the data-parallel group
		if err != nil {
			return err
		}
		hook := &overflowOnce{rank: 1, step: 2}
		var mine []trainer.StepMetrics
		m, err := mesh.New(g, 1, 1, n, 1)
		if err != nil {
			return err
		}
		tr, err := trainer.New(cfg, trainer.Options{Train: ptest.Corpus(), Rank: g.Rank(), World: n, Mesh: m,
			Plugins: []trainer.Plugin{d, hook},
			OnStep:  func(m trainer.StepMetrics) { mine = append(mine, m) }})
		if err != nil {
			return err
		}
		if _, err := tr.Run(context.Background()); err != nil {
			return err
		}
		mu.Lock()
		steps[g.Rank()], hooks[g.Rank()] = mine, hook
		params[g.Rank()] = slices.Clone(tr.Model.Param("h.1.attn.c_proj.weight").F32())
		mu.Unlock()
		return nil
	})
	require.NoError(t, err)
	// Window 2: doubled after steps 0 and 1, halved by the overflow of
	// step 2, doubled after steps 3 and 4.
	wantScale := []float64{65536, 131072, 65536, 65536, 131072, 131072}
	for r := 0; r < n; r++ {
		require.Len(t, steps[r], 6)
		for s, m := range steps[r] {
			require.Equal(t, s == 2, m.Skipped, "rank %d step %d skipped", r, s)
			require.Equal(t, s != 2, hooks[r].changed[s], "rank %d step %d: weights or moments changed", r, s)
			require.Equal(t, wantScale[s], m.LossScale, "rank %d step %d loss scale", r, s)
			require.False(t, math.IsNaN(m.Loss) || math.IsInf(m.Loss, 0), "rank %d step %d loss", r, s)
			if s != 2 {
				require.False(t, math.IsInf(m.GradNorm, 0) || math.IsNaN(m.GradNorm), "rank %d step %d norm", r, s)
			}
		}
	}
	require.Equal(t, params[0], params[1], "the replicas stay identical")
	for _, v := range params[0] {
		require.False(t, math.IsNaN(float64(v)) || math.IsInf(float64(v), 0))
	}
}
