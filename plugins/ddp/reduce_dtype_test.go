package ddp_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ddp"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// gradProbe records every gradient of the first step when its PreStep
// runs: listed before ddp it sees the rank's own gradients (naive mode
// reduces in PreStep), listed after it the reduced ones.
type gradProbe struct {
	name  string
	grads map[string][]float32
}

func (p *gradProbe) Name() string { return p.name }

func (p *gradProbe) PreStep(t *trainer.Trainer) error {
	if p.grads == nil {
		p.grads = map[string][]float32{}
		for _, w := range t.Model.Params() {
			p.grads[w.Name] = slices.Clone(w.Grad.F32())
		}
	}
	return nil
}

// reduceRun trains one step on 2 ranks under bf16 with ddp.reduce_dtype=bf16
// and returns each rank's gradients before and after the reduction.
func reduceRun(t *testing.T, mode string) (before, after [2]map[string][]float32) {
	cfg := ptest.Config()
	cfg.Train.Steps, cfg.Train.MixedPrecision, cfg.DDP.ReduceDType = 1, "bf16", "bf16"
	cfg.Train.BatchSize /= 2
	var mu sync.Mutex
	require.NoError(t, comm.RunLocal(2, comm.Options{}, func(g comm.Group) error {
		d, err := ddp.New(g, mode, 0.02, 0.005)
		if err != nil {
			return err
		}
		d.Reduce = ddp.ReduceDType(cfg)
		pre, post := &gradProbe{name: "before-ddp"}, &gradProbe{name: "after-ddp"}
		m, err := mesh.New(g, 1, 1, 2, 1)
		if err != nil {
			return err
		}
		tr, err := trainer.New(cfg, trainer.Options{Train: ptest.Corpus(), Rank: g.Rank(), World: 2, Mesh: m,
			Plugins: []trainer.Plugin{pre, d, post}})
		if err != nil {
			return err
		}
		if _, err := tr.Run(context.Background()); err != nil {
			return err
		}
		mu.Lock()
		before[g.Rank()], after[g.Rank()] = pre.grads, post.grads
		mu.Unlock()
		return nil
	}))
	return before, after
}

// Under ddp.reduce_dtype=bf16 every reduced gradient element is the rule of
// comm's half-precision reductions applied to the ranks' own gradients:
// each rounded to bf16, averaged in float32, rounded once, the same bits
// on both ranks. The bucketed mode, which reduces during backward, gives
// the naive mode's bits.
func TestReduceDTypeBF16RoundsOnce(t *testing.T) {
	before, after := reduceRun(t, ddp.Naive)
	for name, g0 := range before[0] {
		g1 := before[1][name]
		want := make([]float32, len(g0))
		for i := range want {
			a, b := cpu.BF16ToF32(cpu.BF16FromF32(g0[i])), cpu.BF16ToF32(cpu.BF16FromF32(g1[i]))
			want[i] = cpu.BF16ToF32(cpu.BF16FromF32((a + b) / 2))
		}
		require.Equal(t, want, after[0][name], "rank 0 %s", name)
		require.Equal(t, want, after[1][name], "rank 1 %s", name)
		require.NotEqual(t, g0, want, "%s: the ranks' gradients differ from their reduction", name)
	}
	_, bucketed := reduceRun(t, ddp.Bucketed)
	require.Equal(t, after[0], bucketed[0])
	require.Equal(t, after[1], bucketed[1])
}
