package pp

import (
	"bytes"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// every calls fn on each generated schedule of the range: p in
// 1..8, m in 1..16, and v in 1..3 for interleaved (m a multiple of p).
func every(t *testing.T, fn func(s *Schedule)) {
	for p := 1; p <= 8; p++ {
		for m := 1; m <= 16; m++ {
			for _, name := range Schedules {
				vs := []int{1}
				if name == Interleaved {
					if m%p != 0 {
						continue
					}
					vs = []int{1, 2, 3}
				}
				for _, v := range vs {
					s, err := Generate(name, p, v, m)
					require.NoError(t, err, "%s p=%d v=%d m=%d", name, p, v, m)
					fn(s)
				}
			}
		}
	}
}

func TestCheckerAcceptsEveryGeneratedSchedule(t *testing.T) {
	n := 0
	every(t, func(s *Schedule) {
		require.NoError(t, s.Check(), "%s p=%d v=%d m=%d", s.Name, s.P, s.V, s.M)
		n++
	})
	require.Equal(t, 8*16*3+3*(16+8+5+4+3+2+2+2), n)
}

// mutate returns a copy of the 1f1b schedule for p=2, m=2 with rank r's
// list changed by fn.
func mutate(t *testing.T, r int, fn func([]Action) []Action) *Schedule {
	s, err := Generate(OneFOneB, 2, 1, 2)
	require.NoError(t, err)
	s.Ranks[r] = fn(slices.Clone(s.Ranks[r]))
	return s
}

func TestCheckerRejectsBrokenSchedules(t *testing.T) {
	s, err := Generate(OneFOneB, 2, 1, 2)
	require.NoError(t, err)
	// Rank 0: F0 send F1 send, then B0 and B1 with their receives.
	require.Equal(t, []Action{
		{Kind: Forward, Chunk: 0, Micro: 0}, {Kind: SendAct, Chunk: 0, Micro: 0, Peer: 1},
		{Kind: Forward, Chunk: 0, Micro: 1}, {Kind: SendAct, Chunk: 0, Micro: 1, Peer: 1},
		{Kind: RecvGrad, Chunk: 0, Micro: 0, Peer: 1}, {Kind: Backward, Chunk: 0, Micro: 0},
		{Kind: RecvGrad, Chunk: 0, Micro: 1, Peer: 1}, {Kind: Backward, Chunk: 0, Micro: 1},
	}, s.Ranks[0])

	for _, c := range []struct {
		name string
		s    *Schedule
		want string
	}{
		{"sends swapped", mutate(t, 0, func(a []Action) []Action {
			a[1], a[3] = a[3], a[1]
			return a
		}), "pp: schedule 1f1b: rank 0, action 1 (send-act chunk 0 micro 1 to rank 1): sends before computing what it sends"},
		{"receives swapped", mutate(t, 0, func(a []Action) []Action {
			a[4], a[6] = a[6], a[4]
			return a
		}), "pp: schedule 1f1b: rank 0, action 4 (recv-grad chunk 0 micro 1 from rank 1): the next message from rank 1 is send-grad chunk 1 micro 0"},
		{"a missing backward", mutate(t, 1, func(a []Action) []Action {
			i := slices.Index(a, Action{Kind: Backward, Chunk: 1, Micro: 1})
			return slices.Delete(a, i, i+2) // the backward and its send
		}), "pp: schedule 1f1b deadlocks: rank 0 waits at action 6 (recv-grad chunk 0 micro 1 from rank 1)"},
		{"a missing receive", mutate(t, 0, func(a []Action) []Action {
			return slices.Delete(a, 6, 7)
		}), "pp: schedule 1f1b: rank 0, action 6 (B chunk 0 micro 1): its output gradient was not received"},
		{"a micro-batch never run", mutate(t, 0, func(a []Action) []Action {
			a = slices.Delete(a, 7, 8)
			return a
		}), "pp: schedule 1f1b: rank 0 never runs B chunk 0 micro 1"},
		{"a receive never posted", mutate(t, 0, func(a []Action) []Action {
			return slices.Delete(a, 6, 8)
		}), "pp: schedule 1f1b: rank 1 sends send-grad chunk 1 micro 1 to rank 0, which never receives it"},
		{"backward before forward", mutate(t, 1, func(a []Action) []Action {
			return append([]Action{{Kind: Backward, Chunk: 1, Micro: 1}}, a...)
		}), "pp: schedule 1f1b: rank 1, action 0 (B chunk 1 micro 1): runs before its forward"},
		{"wrong rank", mutate(t, 1, func(a []Action) []Action {
			return append([]Action{{Kind: Forward, Chunk: 0, Micro: 0}}, a...)
		}), "pp: schedule 1f1b: rank 1, action 0 (F chunk 0 micro 0): chunk 0 lives on rank 0"},
	} {
		require.EqualError(t, c.s.Check(), c.want, c.name)
	}
	// A micro-batch a rank never runs, without any communication to
	// betray it (the last stage's weight gradient in zb1).
	z, err := Generate(ZB1, 2, 1, 2)
	require.NoError(t, err)
	z.Ranks[1] = z.Ranks[1][:len(z.Ranks[1])-1]
	require.EqualError(t, z.Check(), "pp: schedule zb1: rank 1 never runs W chunk 1 micro 1")
}

func TestGenerateErrors(t *testing.T) {
	_, err := Generate(Interleaved, 4, 2, 6)
	require.EqualError(t, err, "pp: the interleaved schedule needs train.grad_accum (micro-batches, 6) to be a multiple of parallel.pp (4)")
	_, err = Generate("gpipe", 2, 1, 2)
	require.EqualError(t, err, `pp: unknown pp.schedule "gpipe": use one of afab, 1f1b, interleaved, zb1`)
	_, err = Generate(OneFOneB, 2, 2, 2)
	require.EqualError(t, err, "pp: pp.virtual_stages=2 needs pp.schedule=interleaved (schedule 1f1b runs one chunk per rank)")
}

// TestSimulatedBubblesEqualTheFormulas: with unit costs the idle time over
// compute time is exactly (p-1)/m for AFAB and 1F1B (every m),
// (p-1)/(v·m) for interleaved, and for ZB-H1 with m >= p exactly
// (p-1)(F+B-W) idle per rank, a third of 1F1B's (p-1)(F+B+W). Below p
// micro-batches ZB-H1 idles (p-1)(F+B) - (m-1)W per rank: more than a
// third, checked as values.
func TestSimulatedBubblesEqualTheFormulas(t *testing.T) {
	every(t, func(s *Schedule) {
		sim, err := s.Simulate(Unit)
		require.NoError(t, err)
		what := fmt.Sprintf("%s p=%d v=%d m=%d", s.Name, s.P, s.V, s.M)
		want, _ := Formula(s.Name, s.P, s.V, s.M)
		p, m := float64(s.P), float64(s.M)
		if s.Name == ZB1 {
			perRank := (p - 1) * (1 + 1 - 1) // (p-1)(F+B-W)
			if s.M < s.P {
				perRank = (p-1)*(1+1) - (m-1)*1
			}
			require.Equal(t, perRank*p, sim.Idle, what)
			if s.M >= s.P {
				oneF, err := Generate(OneFOneB, s.P, 1, s.M)
				require.NoError(t, err)
				o, err := oneF.Simulate(Unit)
				require.NoError(t, err)
				require.Equal(t, o.Idle/3, sim.Idle, "%s: a third of 1F1B's", what)
			} else {
				require.Greater(t, sim.Bubble(), want, what)
			}
		}
		if s.Name != ZB1 || s.M >= s.P {
			require.Equal(t, want, sim.Bubble(), what)
		}
		require.InDelta(t, want/(1+want), IdleFormula(s.Name, s.P, s.V, s.M), 1e-15)
	})
	// The values below p for p = 4: 6, 5 and 4 idle units per rank.
	for m, want := range map[int]float64{1: 24.0 / 12, 2: 20.0 / 24, 3: 16.0 / 36} {
		s, err := Generate(ZB1, 4, 1, m)
		require.NoError(t, err)
		sim, err := s.Simulate(Unit)
		require.NoError(t, err)
		require.Equal(t, want, sim.Bubble(), "zb1 p=4 m=%d", m)
	}
}

// TestMicroBatchesAlive: AFAB keeps all m micro-batches alive on every
// rank, 1F1B min(p-r, m) on rank r, and ZB-H1 (whose W keeps a
// micro-batch's activations) never more than 1F1B's peak over ranks.
func TestMicroBatchesAlive(t *testing.T) {
	every(t, func(s *Schedule) {
		sim, err := s.Simulate(Unit)
		require.NoError(t, err)
		what := fmt.Sprintf("%s p=%d v=%d m=%d", s.Name, s.P, s.V, s.M)
		for r, n := range sim.PeakAlive {
			switch s.Name {
			case AFAB:
				require.Equal(t, s.M, n, what)
			case OneFOneB:
				require.Equal(t, min(s.P-r, s.M), n, what)
			case ZB1:
				require.LessOrEqual(t, n, min(s.P, s.M), what)
			}
		}
	})
}

func TestDraw(t *testing.T) {
	s, err := Generate(OneFOneB, 4, 1, 8)
	require.NoError(t, err)
	sim, err := s.Simulate(Unit)
	require.NoError(t, err)
	var out bytes.Buffer
	require.NoError(t, Draw(&out, sim, 4, 1, 1))
	require.Equal(t, ""+
		"rank 0 | F0 F1 F2 F3 .  .  .  .  .  .  B0 B0 F4 B1 B1 F5 B2 B2 F6 B3 B3 F7 B4 B4 .  B5 B5 .  B6 B6 .  B7 B7\n"+
		"rank 1 | .  F0 F1 F2 .  .  .  .  B0 B0 F3 B1 B1 F4 B2 B2 F5 B3 B3 F6 B4 B4 F7 B5 B5 .  B6 B6 .  B7 B7 .  .\n"+
		"rank 2 | .  .  F0 F1 .  .  B0 B0 F2 B1 B1 F3 B2 B2 F4 B3 B3 F5 B4 B4 F6 B5 B5 F7 B6 B6 .  B7 B7 .  .  .  .\n"+
		"rank 3 | .  .  .  F0 B0 B0 F1 B1 B1 F2 B2 B2 F3 B3 B3 F4 B4 B4 F5 B5 B5 F6 B6 B6 F7 B7 B7 .  .  .  .  .  .\n",
		out.String())
	require.Equal(t, "bubble ratio (idle ÷ compute): 0.375 (formula (p-1)/m = 0.375); idle share of wall time: 0.273 (formula (p-1)/(m+p-1) = 0.273)", BubbleLine(sim.Bubble(), OneFOneB, 4, 1, 8))
	require.Equal(t, "bubble ratio (idle ÷ compute): 0.0417 (formula (p-1)/(3m) = 0.0417); idle share of wall time: 0.0400 (formula b/(1+b), b = (p-1)/(3m) = 0.0400)", BubbleLine(1.0/24, ZB1, 2, 1, 8))
	require.Equal(t, "1.000", Decimal(1))
}
