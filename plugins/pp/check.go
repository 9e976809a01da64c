package pp

import (
	"fmt"
	"strings"
)

// Costs are the times of one chunk's forward (F), input-gradient backward
// (B) and weight-gradient backward (W) on one micro-batch. A schedule that
// does not split backward pays B+W in its Backward actions.
// Communication is free in the simulation.
type Costs struct {
	F, B, W float64
	// L is a message's latency: from the send to its arrival at the peer;
	// S and R are how long a send and a receive of an arrived message
	// keep their rank busy (all 0: free communication, as in the bubble
	// formulas).
	L, S, R float64
}

// Unit is F = B = W = 1, the costs of the bubble formulas.
var Unit = Costs{F: 1, B: 1, W: 1}

// Span is a compute action placed in time.
type Span struct {
	Action
	Start, End float64
}

// Sim is a schedule played out: when every rank computes what.
type Sim struct {
	Spans    [][]Span // per rank, compute actions in order
	Makespan float64  // the step's length
	Compute  float64  // compute time summed over ranks
	Idle     float64  // idle time inside the step summed over ranks
	// PeakAlive is, per rank, the most micro-batches (of any chunk) whose
	// forward ran and whose backward (W, when split) did not: what holds
	// activations.
	PeakAlive []int
}

// Bubble is idle time over compute time, the quantity of the formulas
// (p-1)/m (AFAB, 1F1B), (p-1)/(v·m) (interleaved), (p-1)/(3m) (ZB-H1).
func (s *Sim) Bubble() float64 { return s.Idle / s.Compute }

// IdleShare is idle time over wall time (ranks × step length): the
// fraction a trace measures. For AFAB and 1F1B it is (p-1)/(m+p-1).
func (s *Sim) IdleShare() float64 { return s.Idle / (s.Makespan * float64(len(s.Spans))) }

// Check plays the schedule with unit costs and reports the first way it
// is wrong: an action whose input is not there (a forward before its
// activation arrived, a backward before its forward), a receive that does
// not match the next message from its peer (a swapped send and receive), a
// deadlock (every unfinished rank waits on a receive nobody will send), a
// message never received, or a micro-batch some chunk never runs forward,
// backward or weight gradient on. Errors name the rank and the action.
func (s *Schedule) Check() error {
	_, err := s.Simulate(Unit)
	return err
}

type msgKey struct {
	kind         Kind // SendAct or SendGrad
	chunk, micro int
}

type message struct {
	msgKey
	at float64
}

// Simulate plays the schedule with the given costs; see Check for the
// errors.
func (s *Schedule) Simulate(c Costs) (*Sim, error) {
	return s.SimulateChunks(func(int) Costs { return c })
}

// SimulateChunks plays the schedule with costs that differ by model chunk
// (the first chunk embeds, the last one runs the head and the loss):
// what a measured run is compared against.
func (s *Schedule) SimulateChunks(costOf func(chunk int) Costs) (*Sim, error) {
	P := s.P
	if len(s.Ranks) != P {
		return nil, fmt.Errorf("pp: schedule %s has lists for %d ranks, want %d", s.Name, len(s.Ranks), P)
	}
	last := s.Chunks() - 1
	sim := &Sim{Spans: make([][]Span, P), PeakAlive: make([]int, P)}
	queues := map[[2]int][]message{} // (from, to) -> FIFO
	type key struct{ chunk, micro int }
	type rankState struct {
		next         int
		t            float64
		alive        int
		got          map[msgKey]bool
		fw, bw, ww   map[key]bool
		computeSpent float64
	}
	rs := make([]*rankState, P)
	for r := range rs {
		rs[r] = &rankState{got: map[msgKey]bool{}, fw: map[key]bool{}, bw: map[key]bool{}, ww: map[key]bool{}}
	}
	fail := func(r int, format string, args ...any) error {
		a := s.Ranks[r][rs[r].next]
		return fmt.Errorf("pp: schedule %s: rank %d, action %d (%s): %s", s.Name, r, rs[r].next, a, fmt.Sprintf(format, args...))
	}
	for {
		progress := false
		for r := 0; r < P; r++ {
			st := rs[r]
			for st.next < len(s.Ranks[r]) {
				a := s.Ranks[r][st.next]
				k := key{a.Chunk, a.Micro}
				c := costOf(a.Chunk)
				if a.Chunk < 0 || a.Chunk > last || a.Micro < 0 || a.Micro >= s.M {
					return nil, fail(r, "no such chunk or micro-batch (chunks 0..%d, micro-batches 0..%d)", last, s.M-1)
				}
				if s.RankOf(a.Chunk) != r {
					return nil, fail(r, "chunk %d lives on rank %d", a.Chunk, s.RankOf(a.Chunk))
				}
				switch a.Kind {
				case SendAct, SendGrad:
					want := a.Chunk + 1
					done := st.fw[k]
					if a.Kind == SendGrad {
						want, done = a.Chunk-1, st.bw[k]
					}
					if want < 0 || want > last || a.Peer != s.RankOf(want) {
						return nil, fail(r, "chunk %d's neighbour in that direction is not on rank %d", a.Chunk, a.Peer)
					}
					if !done {
						return nil, fail(r, "sends before computing what it sends")
					}
					q := [2]int{r, a.Peer}
					queues[q] = append(queues[q], message{msgKey{a.Kind, a.Chunk, a.Micro}, st.t + c.L})
					st.t += c.S
				case RecvAct, RecvGrad:
					want := msgKey{SendAct, a.Chunk - 1, a.Micro}
					if a.Kind == RecvGrad {
						want = msgKey{SendGrad, a.Chunk + 1, a.Micro}
					}
					if want.chunk < 0 || want.chunk > last || a.Peer != s.RankOf(want.chunk) {
						return nil, fail(r, "chunk %d's neighbour in that direction is not on rank %d", a.Chunk, a.Peer)
					}
					q := [2]int{a.Peer, r}
					if len(queues[q]) == 0 {
						goto blocked
					}
					m := queues[q][0]
					if m.msgKey != want {
						return nil, fail(r, "the next message from rank %d is %s chunk %d micro %d", a.Peer, m.kind, m.chunk, m.micro)
					}
					queues[q] = queues[q][1:]
					st.t = max(st.t, m.at) + c.R
					st.got[msgKey{a.Kind, a.Chunk, a.Micro}] = true
				case Forward:
					if st.fw[k] {
						return nil, fail(r, "runs twice")
					}
					if a.Chunk > 0 && !st.got[msgKey{RecvAct, a.Chunk, a.Micro}] {
						return nil, fail(r, "its input activation was not received")
					}
					st.fw[k] = true
					st.alive++
					sim.PeakAlive[r] = max(sim.PeakAlive[r], st.alive)
					sim.Spans[r] = append(sim.Spans[r], Span{a, st.t, st.t + c.F})
					st.t += c.F
					st.computeSpent += c.F
				case Backward:
					if st.bw[k] {
						return nil, fail(r, "runs twice")
					}
					if !st.fw[k] {
						return nil, fail(r, "runs before its forward")
					}
					if a.Chunk < last && !st.got[msgKey{RecvGrad, a.Chunk, a.Micro}] {
						return nil, fail(r, "its output gradient was not received")
					}
					st.bw[k] = true
					d := c.B
					if !s.Split {
						d += c.W
						st.alive--
					}
					sim.Spans[r] = append(sim.Spans[r], Span{a, st.t, st.t + d})
					st.t += d
					st.computeSpent += d
				case Weight:
					if !s.Split {
						return nil, fail(r, "schedule %s does not split backward", s.Name)
					}
					if st.ww[k] {
						return nil, fail(r, "runs twice")
					}
					if !st.bw[k] {
						return nil, fail(r, "runs before its input-gradient backward")
					}
					st.ww[k] = true
					st.alive--
					sim.Spans[r] = append(sim.Spans[r], Span{a, st.t, st.t + c.W})
					st.t += c.W
					st.computeSpent += c.W
				}
				st.next++
				progress = true
			}
		blocked:
		}
		if !progress {
			break
		}
	}
	var stuck []string
	for r, st := range rs {
		if st.next < len(s.Ranks[r]) {
			stuck = append(stuck, fmt.Sprintf("rank %d waits at action %d (%s)", r, st.next, s.Ranks[r][st.next]))
		}
	}
	if len(stuck) > 0 {
		return nil, fmt.Errorf("pp: schedule %s deadlocks: %s", s.Name, strings.Join(stuck, "; "))
	}
	for q, ms := range queues {
		if len(ms) > 0 {
			m := ms[0]
			return nil, fmt.Errorf("pp: schedule %s: rank %d sends %s chunk %d micro %d to rank %d, which never receives it", s.Name, q[0], m.kind, m.chunk, m.micro, q[1])
		}
	}
	for r, st := range rs {
		for c := r; c <= last; c += P {
			for i := 0; i < s.M; i++ {
				k := key{c, i}
				switch {
				case !st.fw[k]:
					return nil, fmt.Errorf("pp: schedule %s: rank %d never runs F chunk %d micro %d", s.Name, r, c, i)
				case !st.bw[k]:
					return nil, fmt.Errorf("pp: schedule %s: rank %d never runs B chunk %d micro %d", s.Name, r, c, i)
				case s.Split && !st.ww[k]:
					return nil, fmt.Errorf("pp: schedule %s: rank %d never runs W chunk %d micro %d", s.Name, r, c, i)
				}
			}
		}
		sim.Makespan = max(sim.Makespan, st.t)
		sim.Compute += st.computeSpent
	}
	sim.Idle = sim.Makespan*float64(P) - sim.Compute
	return sim, nil
}

// Formula is the bubble (idle over compute time) the literature gives
// for the schedule with F = B = W, and its text: (p-1)/m for AFAB and
// 1F1B, (p-1)/(v·m) for interleaved, (p-1)/(3m) for ZB-H1 (exact for
// m >= p; below that ZB-H1's real bubble is larger).
func Formula(name string, p, v, m int) (float64, string) {
	P, V, M := float64(p), float64(v), float64(m)
	switch name {
	case Interleaved:
		return (P - 1) / (V * M), "(p-1)/(v·m)"
	case ZB1:
		return (P - 1) / (3 * M), "(p-1)/(3m)"
	}
	return (P - 1) / M, "(p-1)/m"
}

// IdleFormula is the formula's idle share of wall time: bubble/(1+bubble),
// e.g. (p-1)/(m+p-1) for AFAB and 1F1B.
func IdleFormula(name string, p, v, m int) float64 {
	b, _ := Formula(name, p, v, m)
	return b / (1 + b)
}
