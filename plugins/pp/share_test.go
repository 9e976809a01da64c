package pp

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// sharedCases are schedules of every kind, with fewer micro-batches than
// ranks and more.
func sharedCases(t *testing.T) []*Schedule {
	t.Helper()
	var out []*Schedule
	for _, c := range []struct {
		name    string
		p, v, m int
	}{
		{AFAB, 2, 1, 1}, {AFAB, 4, 1, 8}, {OneFOneB, 2, 1, 4}, {OneFOneB, 4, 1, 2},
		{Interleaved, 2, 2, 4}, {Interleaved, 4, 2, 8}, {ZB1, 2, 1, 1}, {ZB1, 4, 1, 8},
	} {
		s, err := Generate(c.name, c.p, c.v, c.m)
		require.NoError(t, err)
		out = append(out, s)
	}
	return out
}

// chunkCosts are unequal costs per chunk: the last carries a head.
func chunkCosts(s *Schedule, c int) Costs {
	x := Costs{F: 1 + 0.25*float64(c), B: 2 + 0.5*float64(c), L: 0.1}
	if s.Split {
		x.B, x.W = x.B/2, x.B/2
	}
	if c == s.Chunks()-1 {
		x.F, x.B = 3*x.F, 3*x.B
	}
	return x
}

// With costs that do not depend on how many ranks compute, the shared
// play is SimulateChunks' play: every span and the makespan.
func TestSharedPlayWithFixedCostsIsTheSimulator(t *testing.T) {
	for _, s := range sharedCases(t) {
		t.Run(fmt.Sprintf("%s p%d v%d m%d", s.Name, s.P, s.V, s.M), func(t *testing.T) {
			want, err := s.SimulateChunks(func(c int) Costs { return chunkCosts(s, c) })
			require.NoError(t, err)
			got, err := s.SimulateShared(func(c, _ int) Costs { return chunkCosts(s, c) })
			require.NoError(t, err)
			require.InDelta(t, want.Makespan, got.Makespan, 1e-9)
			require.InDelta(t, want.Idle, got.Idle, 1e-9)
			for r := range want.Spans {
				require.Len(t, got.Spans[r], len(want.Spans[r]))
				for i, w := range want.Spans[r] {
					g := got.Spans[r][i]
					require.Equal(t, w.Action, g.Action)
					require.InDelta(t, w.Start, g.Start, 1e-9, "rank %d %s", r, w.Action)
					require.InDelta(t, w.End, g.End, 1e-9, "rank %d %s", r, w.Action)
				}
			}
		})
	}
}

// Every rank on one core: an action of work x takes x·busy while busy
// ranks share the core. Without message latency some rank can always
// compute, so the core never idles and the step is the total work, the
// bubble gone, whatever the schedule; SimulateChunks, which gives each
// rank the whole core, has a bubble.
func TestSharedPlayOnOneCoreHasNoBubble(t *testing.T) {
	for _, s := range sharedCases(t) {
		t.Run(fmt.Sprintf("%s p%d v%d m%d", s.Name, s.P, s.V, s.M), func(t *testing.T) {
			work := func(c int) Costs { x := chunkCosts(s, c); x.L = 0; return x }
			total := 0.0
			for c := range s.Chunks() {
				x := work(c)
				total += float64(s.M) * (x.F + x.B + x.W)
			}
			got, err := s.SimulateShared(func(c, busy int) Costs {
				x := work(c)
				k := float64(busy)
				return Costs{F: k * x.F, B: k * x.B, W: k * x.W}
			})
			require.NoError(t, err)
			require.InDelta(t, total, got.Makespan, 1e-9*total)
			alone, err := s.SimulateChunks(work)
			require.NoError(t, err)
			require.Greater(t, alone.Idle, 0.0)
		})
	}
}
