package pp_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/trace"
	"github.com/tinyacc/tinyacc/plugins/pp"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// TestExecutorRunsTheScheduleInOrder: the traced compute spans of a step
// are, rank by rank, exactly the schedule's F, B and W actions in list
// order, and FromTrace recovers the run's schedule and sizes.
func TestExecutorRunsTheScheduleInOrder(t *testing.T) {
	for _, c := range []struct {
		name string
		v, m int
	}{{"zb1", 1, 4}, {"interleaved", 2, 4}, {"afab", 1, 3}} {
		cfg := base(4, c.m)
		cfg.Train.Steps = 2
		cfg.Parallel.PP, cfg.PP.Schedule, cfg.PP.VirtualStages = 2, c.name, c.v
		got := ptest.Parallel(t, cfg, 2, "local", build(cfg))
		ranks := [][]trace.Event{got[0].Trace, got[1].Trace}
		tr, err := pp.FromTrace(ranks, 1)
		require.NoError(t, err)
		require.Equal(t, c.name, tr.Schedule)
		require.Equal(t, []int{2, c.v, c.m}, []int{tr.P, tr.V, tr.M})
		s, err := pp.Generate(c.name, 2, c.v, c.m)
		require.NoError(t, err)
		for r := range s.Ranks {
			var want, ran []pp.Action
			for _, a := range s.Ranks[r] {
				if a.Kind <= pp.Weight {
					want = append(want, a)
				}
			}
			for _, sp := range tr.Sim.Spans[r] {
				ran = append(ran, sp.Action)
			}
			require.Equal(t, want, ran, "%s: rank %d", c.name, r)
		}
		require.Positive(t, tr.Sim.Makespan)
		require.Greater(t, tr.Sim.Idle, 0.0, "two stages always wait for each other")
	}
}
