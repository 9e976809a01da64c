package pp

import (
	"fmt"
	"strings"
)

// Kind is what one action of a schedule does.
type Kind int

const (
	// Forward runs a chunk's forward on a micro-batch.
	Forward Kind = iota
	// Backward runs a chunk's backward on a micro-batch: input and weight
	// gradients together, or only the input gradient when the schedule
	// splits backward (then a Weight action follows later).
	Backward
	// Weight computes a chunk's deferred weight gradients of a micro-batch.
	Weight
	// SendAct sends a forward's output to the rank of the next chunk.
	SendAct
	// RecvAct receives a forward's input from the rank of the previous chunk.
	RecvAct
	// SendGrad sends a backward's input gradient to the previous chunk's rank.
	SendGrad
	// RecvGrad receives a backward's output gradient from the next chunk's rank.
	RecvGrad
)

var kindNames = [...]string{"F", "B", "W", "send-act", "recv-act", "send-grad", "recv-grad"}

func (k Kind) String() string { return kindNames[k] }

// Action is one step of one rank's list: Kind on micro-batch Micro of
// model chunk Chunk (0 .. p·v-1, in model order; chunk c lives on rank
// c mod p). Peer is the other rank of a send or receive.
type Action struct {
	Kind  Kind
	Chunk int
	Micro int
	Peer  int
}

func (a Action) String() string {
	switch a.Kind {
	case Forward, Backward, Weight:
		return fmt.Sprintf("%s chunk %d micro %d", a.Kind, a.Chunk, a.Micro)
	case SendAct, SendGrad:
		return fmt.Sprintf("%s chunk %d micro %d to rank %d", a.Kind, a.Chunk, a.Micro, a.Peer)
	}
	return fmt.Sprintf("%s chunk %d micro %d from rank %d", a.Kind, a.Chunk, a.Micro, a.Peer)
}

// compute reports whether a is work (F, B, W) rather than communication.
func (a Action) compute() bool { return a.Kind <= Weight }

// Schedule is a pipeline schedule as data: for every rank, the ordered
// list of what it does in one optimizer step.
type Schedule struct {
	Name string
	P    int // ranks (pipeline stages)
	V    int // model chunks per rank
	M    int // micro-batches per step
	// Split is set when backward is split into B (input gradient) and W
	// (weight gradient) actions.
	Split bool
	Ranks [][]Action
}

// Chunks is the number of model chunks, p·v.
func (s *Schedule) Chunks() int { return s.P * s.V }

// RankOf is the rank holding model chunk c.
func (s *Schedule) RankOf(c int) int { return c % s.P }

// Names of the schedules (the values of pp.schedule).
const (
	AFAB        = "afab"
	OneFOneB    = "1f1b"
	Interleaved = "interleaved"
	ZB1         = "zb1"
)

// Schedules lists every schedule name.
var Schedules = []string{AFAB, OneFOneB, Interleaved, ZB1}

// Generate builds the named schedule for p ranks, v chunks per rank and m
// micro-batches. v must be 1 except for the interleaved schedule, which
// needs m to be a multiple of p.
func Generate(name string, p, v, m int) (*Schedule, error) {
	if p < 1 || v < 1 || m < 1 {
		return nil, fmt.Errorf("pp: schedule %s needs p, v and m >= 1, got p=%d v=%d m=%d", name, p, v, m)
	}
	if name != Interleaved && v != 1 {
		return nil, fmt.Errorf("pp: pp.virtual_stages=%d needs pp.schedule=interleaved (schedule %s runs one chunk per rank)", v, name)
	}
	s := &Schedule{Name: name, P: p, V: v, M: m}
	var order [][]Action // per rank, compute actions only
	switch name {
	case AFAB:
		order = afab(p, m)
	case OneFOneB:
		order = oneFOneB(p, 1, m, oneFOneBWarmup(p, 1))
	case Interleaved:
		if m%p != 0 {
			return nil, fmt.Errorf("pp: the interleaved schedule needs train.grad_accum (micro-batches, %d) to be a multiple of parallel.pp (%d)", m, p)
		}
		order = oneFOneB(p, v, m, oneFOneBWarmup(p, v))
	case ZB1:
		s.Split = true
		order = zb1(p, m)
	default:
		return nil, fmt.Errorf("pp: unknown pp.schedule %q: use one of %s", name, strings.Join(Schedules, ", "))
	}
	for _, acts := range order {
		s.Ranks = append(s.Ranks, s.withComm(acts))
	}
	return s, nil
}

// withComm inserts the point-to-point actions around compute actions: a
// forward receives its input just before it runs and sends its output just
// after, a backward likewise with gradients. Sends are eager (they complete
// once the data left), so a rank never waits on a send.
func (s *Schedule) withComm(acts []Action) []Action {
	var out []Action
	last := s.Chunks() - 1
	for _, a := range acts {
		c, i := a.Chunk, a.Micro
		switch a.Kind {
		case Forward:
			if c > 0 {
				out = append(out, Action{Kind: RecvAct, Chunk: c, Micro: i, Peer: s.RankOf(c - 1)})
			}
			out = append(out, a)
			if c < last {
				out = append(out, Action{Kind: SendAct, Chunk: c, Micro: i, Peer: s.RankOf(c + 1)})
			}
		case Backward:
			if c < last {
				out = append(out, Action{Kind: RecvGrad, Chunk: c, Micro: i, Peer: s.RankOf(c + 1)})
			}
			out = append(out, a)
			if c > 0 {
				out = append(out, Action{Kind: SendGrad, Chunk: c, Micro: i, Peer: s.RankOf(c - 1)})
			}
		default:
			out = append(out, a)
		}
	}
	return out
}

func f(c, i int) Action { return Action{Kind: Forward, Chunk: c, Micro: i} }
func b(c, i int) Action { return Action{Kind: Backward, Chunk: c, Micro: i} }
func w(c, i int) Action { return Action{Kind: Weight, Chunk: c, Micro: i} }

// afab is GPipe: every forward, then every backward (a warm-up of all m
// forwards). Each rank keeps all m micro-batches' activations until its
// backwards start.
func afab(p, m int) [][]Action {
	return oneFOneB(p, 1, m, func(int) int { return m })
}

// oneFOneBWarmup is what rank r's first backward waits for. With one chunk
// it is the p-1-r forwards that fill the stages after it, so at most p-r
// micro-batches are alive on rank r and the bubble is that of AFAB. With
// v chunks it is the other v-1 chunks' forwards of the first group of p
// micro-batches, (v-1)·p, plus (p-1-r)·2 for the first micro-batch to go
// down the later stages and its gradient to come back; each pipeline fill
// now costs a chunk's time instead of a stage's, so the bubble shrinks by
// v.
func oneFOneBWarmup(p, v int) func(r int) int {
	if v == 1 {
		return func(r int) int { return p - 1 - r }
	}
	return func(r int) int { return (p-1-r)*2 + (v-1)*p }
}

// oneFOneB generates the schedules without a split backward over v chunks
// per rank (rank r holds chunks r, r+p, ..., r+(v-1)p): rank r runs
// warm(r) forwards (at most all v·m), then alternates one forward and one
// backward, then finishes the backwards. Micro-batches go through a
// rank's chunks in groups of p: the k-th forward of a rank is chunk
// (k/p) mod v of micro-batch (k/(p·v))·p + k mod p, and backwards walk
// the chunks in reverse (for v = 1: chunk r, micro-batch k). With
// oneFOneBWarmup it is 1F1B (v = 1) and the interleaved schedule (v > 1);
// afab is its warm-up of every forward.
func oneFOneB(p, v, m int, warm func(r int) int) [][]Action {
	total := v * m
	fwd := func(r, k int) Action {
		return f((k/p)%v*p+r, (k/(p*v))*p+k%p)
	}
	bwd := func(r, k int) Action {
		return b((v-1-(k/p)%v)*p+r, (k/(p*v))*p+k%p)
	}
	out := make([][]Action, p)
	for r := range out {
		var acts []Action
		nf, nb := 0, 0
		for ; nf < min(warm(r), total); nf++ {
			acts = append(acts, fwd(r, nf))
		}
		for ; nf < total; nf, nb = nf+1, nb+1 {
			acts = append(acts, fwd(r, nf), bwd(r, nb))
		}
		for ; nb < total; nb++ {
			acts = append(acts, bwd(r, nb))
		}
		out[r] = acts
	}
	return out
}

// zb1 is ZB-H1: backward split into B (input gradient, on the critical
// path to the previous stage) and W (weight gradient, needed by nothing
// but the optimizer step). Rank r runs 1F1B's p-r warm-up forwards, then
// repeats B, W, F, except that it keeps r weight gradients back and runs
// them last. The later a stage, the sooner its last B is done and the
// longer it would idle in the cool-down; the held-back W's fill exactly
// that wait, while its B's reach the earlier stages one unit apart. A
// micro-batch's activations live until its W, so rank r holds at most
// (p-r) in flight + r held back = p micro-batches: 1F1B's peak (rank
// 0's). With unit costs F = B = W and m >= p every rank idles p-1 units
// (the wait for the first backward) against 3m of work: (p-1)/(3m), a
// third of 1F1B's (p-1)(F+B+W)/(m(F+B+W)).
func zb1(p, m int) [][]Action {
	out := make([][]Action, p)
	for r := range out {
		hold := r
		var acts []Action
		nf, nb, nw := 0, 0, 0
		for ; nf < min(p-r, m); nf++ {
			acts = append(acts, f(r, nf))
		}
		for nb < m {
			acts = append(acts, b(r, nb))
			nb++
			if nb-nw > hold {
				acts = append(acts, w(r, nw))
				nw++
			}
			if nf < m {
				acts = append(acts, f(r, nf))
				nf++
			}
		}
		for ; nw < m; nw++ {
			acts = append(acts, w(r, nw))
		}
		out[r] = acts
	}
	return out
}
