package pp

import (
	"fmt"
	"html"
	"io"
	"math"
	"sort"
	"strings"

	"github.com/tinyacc/tinyacc/core/trace"
)

// label is a compute span's text in a timeline cell: F, B or W and the
// micro-batch, with the rank-local chunk after a dot when a rank holds
// several chunks.
func label(a Action, p, v int) string {
	s := fmt.Sprintf("%s%d", a.Kind, a.Micro)
	if v > 1 {
		s += fmt.Sprintf(".%d", a.Chunk/p)
	}
	return s
}

// Draw writes the timeline of sim: one row per rank, one cell per unit
// of time (unit: the length of one cell; 1 for unit costs), each cell the
// action running then or "." when the rank waits.
func Draw(w io.Writer, sim *Sim, p, v int, unit float64) error {
	width := 2
	for _, spans := range sim.Spans {
		for _, s := range spans {
			width = max(width, len(label(s.Action, p, v)))
		}
	}
	cells := int(math.Round(sim.Makespan / unit))
	for r, spans := range sim.Spans {
		row := make([]string, cells)
		for i := range row {
			row[i] = "."
		}
		for _, s := range spans {
			a, b := int(math.Round(s.Start/unit)), int(math.Round(s.End/unit))
			b = max(b, a+1) // every span is seen, however short
			for c := a; c < b && c < cells; c++ {
				row[c] = label(s.Action, p, v)
			}
		}
		var sb strings.Builder
		fmt.Fprintf(&sb, "rank %d |", r)
		for _, c := range row {
			fmt.Fprintf(&sb, " %-*s", width, c)
		}
		if _, err := fmt.Fprintln(w, strings.TrimRight(sb.String(), " ")); err != nil {
			return err
		}
	}
	return nil
}

// Decimal formats x with at least three significant digits (0.375,
// 0.0417, 1.000).
func Decimal(x float64) string {
	d := 3
	for a := math.Abs(x); a > 0 && a < 0.1 && d < 12; a *= 10 {
		d++
	}
	return fmt.Sprintf("%.*f", d, x)
}

// BubbleLine is the bubble ratio beside its formula and the idle share of
// wall time beside its own, named apart because both are quoted as "the
// bubble": the ratio is idle ÷ compute time, (p-1)/m for AFAB and 1F1B;
// the share is idle ÷ (ranks × step time), (p-1)/(m+p-1), the fraction a
// trace measures and `tinyacc bench pp` reports. One follows from the
// other: share = ratio/(1+ratio).
func BubbleLine(bubble float64, name string, p, v, m int) string {
	f, text := Formula(name, p, v, m)
	return fmt.Sprintf("bubble ratio (idle ÷ compute): %s (formula %s = %s); idle share of wall time: %s (formula %s = %s)",
		Decimal(bubble), text, Decimal(f), Decimal(bubble/(1+bubble)), idleFormulaText(name), Decimal(IdleFormula(name, p, v, m)))
}

// idleFormulaText is IdleFormula written out.
func idleFormulaText(name string) string {
	switch name {
	case Interleaved:
		return "(p-1)/(v·m+p-1)"
	case ZB1:
		return "b/(1+b), b = (p-1)/(3m)"
	}
	return "(p-1)/(m+p-1)"
}

// svgKinds are the legend of SVG: each compute kind's colour and name.
var svgKinds = []struct {
	kind   Kind
	colour string
	name   string
}{
	{Forward, "#7fb3d5", "F forward"},
	{Backward, "#f0b27a", "B backward"},
	{Weight, "#82e0aa", "W weight gradient"},
}

// SVG writes the timeline of sim as an SVG picture: one row per rank, a
// box per compute span coloured by kind (forward, backward, weight) and
// labelled as Draw labels it, a legend of the colours (blank is idle),
// and caption (the bubble line) below. Cells are as wide as the longest
// label needs, so no label runs out of its box.
func SVG(w io.Writer, sim *Sim, p, v int, unit float64, caption string) error {
	const charW, rh, left, top, fontSize = 7.0, 26.0, 60.0, 10.0, 11
	longest := 2
	for _, spans := range sim.Spans {
		for _, s := range spans {
			longest = max(longest, len(label(s.Action, p, v)))
		}
	}
	cw := float64(longest)*charW + 8
	cells := sim.Makespan / unit
	rowsEnd := top + float64(len(sim.Spans))*rh
	width := max(left+cells*cw+10, float64(len(caption))*charW+20)
	height := rowsEnd + 2*rh + 10
	colour := map[Kind]string{}
	for _, k := range svgKinds {
		colour[k.kind] = k.colour
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="monospace" font-size="%d">`+"\n", width, height, fontSize)
	fmt.Fprintf(&sb, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	for r, spans := range sim.Spans {
		y := top + float64(r)*rh
		fmt.Fprintf(&sb, `<text x="4" y="%.1f">rank %d</text>`+"\n", y+rh/2+4, r)
		for _, s := range spans {
			x := left + s.Start/unit*cw
			bw := max((s.End-s.Start)/unit*cw, 1)
			fmt.Fprintf(&sb, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" stroke="#333"/>`+"\n", x, y+2, bw, rh-4, colour[s.Kind])
			fmt.Fprintf(&sb, `<text x="%.1f" y="%.1f">%s</text>`+"\n", x+3, y+rh/2+4, label(s.Action, p, v))
		}
	}
	x := left
	for _, k := range svgKinds {
		fmt.Fprintf(&sb, `<rect x="%.1f" y="%.1f" width="14" height="14" fill="%s" stroke="#333"/><text x="%.1f" y="%.1f">%s</text>`+"\n",
			x, rowsEnd+6, k.colour, x+18, rowsEnd+17, k.name)
		x += 18 + float64(len(k.name))*charW + 16
	}
	fmt.Fprintf(&sb, `<text x="%.1f" y="%.1f">blank: idle</text>`+"\n", x, rowsEnd+17)
	fmt.Fprintf(&sb, `<text x="4" y="%.1f">%s</text>`+"\n", rowsEnd+rh+17, html.EscapeString(caption))
	sb.WriteString("</svg>\n")
	_, err := io.WriteString(w, sb.String())
	return err
}

// Trace span names and category of the executor's compute actions; the
// step and the clock offset go in the span's arguments.
const (
	traceCat   = "pp"
	clockEvent = "pp clock"
	// commCat spans are the point-to-point transfers between stages,
	// named "send" or "recv", with the message's kind, chunk and
	// micro-batch: FromTrace pairs them to measure latency.
	commCat = "pp-comm"
)

// Traced is one training step of a traced run, rebuilt as a timeline.
type Traced struct {
	Sim      *Sim   // one row per rank, times in µs from the step's first action
	Schedule string // the run's pp.schedule
	P, V, M  int    // stages, chunks per rank, micro-batches
	Unit     float64
	// Latency is the median time from a send's start to the end of its
	// receive, over the messages whose receiver was already waiting (so
	// the time is the transfer's, not the receiver's lateness); 0 when no
	// message qualifies. SendBusy is the median length of a send span;
	// RecvBusy that of a receive that started after its send ended (the
	// message was there: what is left is taking it in).
	Latency, SendBusy, RecvBusy float64
}

// FromTrace rebuilds the timeline of one training step from the trace
// events of every rank (one slice per rank, as written by the executor):
// the compute spans of that step, on one clock, starting at 0, one row per
// rank. Unit is the shortest forward span, a good cell size for Draw.
func FromTrace(ranks [][]trace.Event, step int) (*Traced, error) {
	n := len(ranks)
	sim := &Sim{Spans: make([][]Span, n), PeakAlive: make([]int, n)}
	tr := &Traced{Sim: sim, Unit: math.Inf(1)}
	origin, end := math.Inf(1), math.Inf(-1)
	sends, recvs := map[transfer][2]float64{}, map[transfer][2]float64{}
	for r, evs := range ranks {
		offset, found := 0.0, false
		for _, e := range evs {
			if e.Name == clockEvent {
				offset, found = num(e.Args["unix_us"])-e.TS, true
				tr.P, tr.V = int(num(e.Args["pp"])), int(num(e.Args["virtual"]))
				tr.Schedule, _ = e.Args["schedule"].(string)
			}
		}
		if !found {
			return nil, fmt.Errorf("pp: rank %d's trace has no %q event (was it written by a pipeline run?)", r, clockEvent)
		}
		for _, e := range evs {
			if e.Cat == commCat && e.Ph == "X" && int(num(e.Args["step"])) == step {
				k := transfer{kind: fmt.Sprint(e.Args["kind"]), chunk: int(num(e.Args["chunk"])), micro: int(num(e.Args["micro"]))}
				span := [2]float64{e.TS + offset, e.TS + offset + e.Dur}
				if e.Name == "send" {
					sends[k] = span
				} else {
					recvs[k] = span
				}
				continue
			}
			if e.Cat != traceCat || e.Ph != "X" || int(num(e.Args["step"])) != step {
				continue
			}
			k := map[string]Kind{"F": Forward, "B": Backward, "W": Weight}[e.Name]
			a := Action{Kind: k, Chunk: int(num(e.Args["chunk"])), Micro: int(num(e.Args["micro"]))}
			s := Span{a, e.TS + offset, e.TS + offset + e.Dur}
			sim.Spans[r] = append(sim.Spans[r], s)
			origin, end = min(origin, s.Start), max(end, s.End)
			if k == Forward {
				tr.Unit = min(tr.Unit, e.Dur)
			}
			tr.M = max(tr.M, a.Micro+1)
			sim.Compute += e.Dur
		}
		sort.SliceStable(sim.Spans[r], func(i, j int) bool { return sim.Spans[r][i].Start < sim.Spans[r][j].Start })
	}
	if math.IsInf(origin, 1) {
		return nil, fmt.Errorf("pp: the trace holds no pipeline spans of step %d", step)
	}
	if tr.P < 1 || tr.V < 1 || tr.Schedule == "" {
		return nil, fmt.Errorf("pp: the trace's %q event does not describe the pipeline", clockEvent)
	}
	for _, spans := range sim.Spans {
		for i := range spans {
			spans[i].Start -= origin
			spans[i].End -= origin
		}
	}
	sim.Makespan = end - origin
	sim.Idle = sim.Makespan*float64(n) - sim.Compute
	var lat, busy, took []float64
	for k, snd := range sends {
		busy = append(busy, snd[1]-snd[0])
		rcv, ok := recvs[k]
		switch {
		case ok && rcv[0] <= snd[0]:
			lat = append(lat, max(0, rcv[1]-snd[0]))
		case ok && rcv[0] >= snd[1]:
			took = append(took, rcv[1]-rcv[0])
		}
	}
	tr.Latency, tr.SendBusy, tr.RecvBusy = medianOf(lat), medianOf(busy), medianOf(took)
	return tr, nil
}

// medianOf is the median of xs, 0 for none; xs is sorted in place.
func medianOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sort.Float64s(xs)
	return xs[len(xs)/2]
}

// transfer names one message of a step: activations ("act") or gradients
// ("grad") of a chunk's micro-batch, as the sending chunk numbers it.
type transfer struct {
	kind         string
	chunk, micro int
}

func num(x any) float64 {
	switch v := x.(type) {
	case float64:
		return v
	case int:
		return float64(v)
	case int64:
		return float64(v)
	}
	return 0
}
