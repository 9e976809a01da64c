package pp

import (
	"fmt"
	"math"
)

// SimulateShared plays the schedule on a machine whose ranks share its
// cores: an action's cost depends on how many ranks compute at that
// moment, costOf(chunk, busy) with busy from 1 to P. A rank that waits
// in the bubble (for a message, or done with its work) leaves its share
// of the cores to the others, so the busy ranks run faster than when
// every rank computes. SimulateChunks is the same play with costs that
// do not depend on busy; on a machine with a core per rank (or an
// accelerator per rank) the two agree.
//
// The play is a fluid one: while busy ranks compute, each advances
// through its action at the rate 1/costOf(chunk, busy); whenever an
// action ends or a waiting rank's input arrives, busy changes and so do
// the rates. An action needs what SimulateChunks checks (its forward's
// input activation from the previous chunk, its backward's output
// gradient from the next and its own forward, a weight gradient its
// backward); a message arrives L after the action that sends it ends.
// The sends' and receives' own costs (S, R) are not played. Spans,
// Makespan, Compute and Idle are as SimulateChunks fills them;
// PeakAlive is left nil.
func (s *Schedule) SimulateShared(costOf func(chunk, busy int) Costs) (*Sim, error) {
	if _, err := s.Simulate(Unit); err != nil { // the schedule's own checks
		return nil, err
	}
	P, last := s.P, s.Chunks()-1
	type key struct {
		kind         Kind
		chunk, micro int
	}
	// The compute actions of each rank, in order.
	acts := make([][]Action, P)
	for r, list := range s.Ranks {
		for _, a := range list {
			if a.compute() {
				acts[r] = append(acts[r], a)
			}
		}
	}
	dur := func(a Action, busy int) float64 {
		c := costOf(a.Chunk, busy)
		switch a.Kind {
		case Forward:
			return c.F
		case Weight:
			return c.W
		}
		if s.Split {
			return c.B
		}
		return c.B + c.W
	}
	done := map[key]float64{} // when an action ended
	// ready is when a's inputs are there, or false while one is not done.
	ready := func(a Action) (float64, bool) {
		var deps []key
		var remote []bool
		switch a.Kind {
		case Forward:
			if a.Chunk > 0 {
				deps, remote = append(deps, key{Forward, a.Chunk - 1, a.Micro}), append(remote, true)
			}
		case Backward:
			deps, remote = append(deps, key{Forward, a.Chunk, a.Micro}), append(remote, false)
			if a.Chunk < last {
				deps, remote = append(deps, key{Backward, a.Chunk + 1, a.Micro}), append(remote, true)
			}
		case Weight:
			deps, remote = append(deps, key{Backward, a.Chunk, a.Micro}), append(remote, false)
		}
		at := 0.0
		for i, d := range deps {
			t, ok := done[d]
			if !ok {
				return 0, false
			}
			if remote[i] {
				t += costOf(d.chunk, 1).L
			}
			at = max(at, t)
		}
		return at, true
	}
	sim := &Sim{Spans: make([][]Span, P)}
	next := make([]int, P)
	left := make([]float64, P)  // the share of the current action still to run
	start := make([]float64, P) // when the current action began; -1 before
	running := make([]bool, P)
	for r := range left {
		left[r], start[r] = 1, -1
	}
	t := 0.0
	for {
		busy, wake, todo := 0, math.Inf(1), 0
		for r := range P {
			running[r] = false
			if next[r] == len(acts[r]) {
				continue
			}
			todo++
			at, ok := ready(acts[r][next[r]])
			switch {
			case ok && at <= t:
				running[r] = true
				busy++
			case ok:
				wake = min(wake, at)
			}
		}
		if todo == 0 {
			break
		}
		if busy == 0 {
			if math.IsInf(wake, 1) {
				return nil, fmt.Errorf("pp: schedule %s deadlocks in the shared play at %g", s.Name, t)
			}
			t = wake
			continue
		}
		// Run until the first action ends or a waiting rank wakes.
		step := wake - t
		for r := range P {
			if running[r] {
				if start[r] < 0 {
					start[r] = t
				}
				step = min(step, left[r]*dur(acts[r][next[r]], busy))
			}
		}
		for r := range P {
			if !running[r] {
				continue
			}
			a := acts[r][next[r]]
			d := dur(a, busy)
			if d <= 0 || left[r]*d <= step*(1+1e-12) {
				done[key{a.Kind, a.Chunk, a.Micro}] = t + step
				sim.Spans[r] = append(sim.Spans[r], Span{a, start[r], t + step})
				next[r]++
				left[r], start[r] = 1, -1
				continue
			}
			left[r] -= step / d
		}
		t += step
	}
	for r := range P {
		for _, sp := range sim.Spans[r] {
			sim.Compute += sp.End - sp.Start
			sim.Makespan = max(sim.Makespan, sp.End)
		}
	}
	sim.Idle = sim.Makespan*float64(P) - sim.Compute
	return sim, nil
}
