package main

import (
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/tp"
	"github.com/tinyacc/tinyacc/plugins/zero"
)

// layoutRow is one row of `bench layouts`: a way of training the same
// model on the same global batch. name and flags may hold one %d, the
// --nproc N of the bench; a row with no flags runs one process. comm is
// the bytes one rank sends per step by the formula (nil: none stated yet,
// printed as "-"). Adding a layout is adding one line to layoutRows.
type layoutRow struct {
	name, flags string
	comm        func(b layoutBench, n int) float64
	// routed, set instead of comm, is a MoE row under expert parallel,
	// whose bytes depend on the routing.
	routed *moeRow
}

// moeRow is a MoE layout of `bench layouts`: expert parallel over the
// N data-parallel ranks (ep = dp = N), beside a tensor-parallel group of
// tp (1: none), so it runs N·tp processes. bytes is its formula for one
// timed step, given that step's metrics line (its expert_rows and
// expert_load): the step's bytes equal it exactly.
type moeRow struct {
	tp    int
	bytes func(b layoutBench, n int, step metricLine) float64
}

var layoutRows = []layoutRow{
	{"1 process", "", func(layoutBench, int) float64 { return 0 }, nil},
	{"dp %d", "--parallel.dp=%d", dpCommBytes, nil},
	{"zero-1 dp %d", "--parallel.dp=%d --zero.stage=1", zeroCommBytes(1), nil},
	{"zero-3 dp %d", "--parallel.dp=%d --zero.stage=3", zeroCommBytes(3), nil},
	{"tp %d", "--parallel.tp=%d", tpCommBytes(false), nil},
	{"tp %d + SP", "--parallel.tp=%d --tp.sequence_parallel=true", tpCommBytes(true), nil},
	{"pp %d afab", "--parallel.pp=%d --pp.schedule=afab" + ppMicroFlag, ppCommBytes(1), nil},
	{"pp %d 1f1b", "--parallel.pp=%d --pp.schedule=1f1b" + ppMicroFlag, ppCommBytes(1), nil},
	{"pp %d interleaved", "--parallel.pp=%d --pp.schedule=interleaved --pp.virtual_stages=2" + ppMicroFlag, ppCommBytes(2), nil},
	{"pp %d zb1", "--parallel.pp=%d --pp.schedule=zb1" + ppMicroFlag, ppCommBytes(1), nil},
	{"cp %d ring", "--parallel.cp=%d --cp.attention=ring", cpCommBytes(true), nil},
	{"cp %d allgather", "--parallel.cp=%d --cp.attention=allgather", cpCommBytes(false), nil},
	{"ep %d MoE", "--parallel.ep=%d --model.moe.experts=%d --model.moe.top_k=2", nil, &moeRow{1, epLayoutBytes}},
	{"ep %d x tp 2 MoE", "--parallel.ep=%d --parallel.tp=2 --model.moe.experts=%d --model.moe.top_k=2 --train.log_every=1", nil, &moeRow{2, epTPLayoutBytes}},
}

// layoutMoE is the MoE rows' model: the bench's GPT with every block a
// mixture of N experts, top-2, the default load-balancing loss.
func layoutMoE(b layoutBench, n int) nn.GPTConfig {
	m := b.model
	m.MoE = nn.MoEConfig{Experts: n, TopK: 2, Every: 1, AuxLossCoef: 0.01}
	return m
}

// epLayoutBytes is epCommBytes (bench_ep.go) for the ep row's model,
// given the step's expert_rows. It assumes every DDP bucket above 32 KiB
// (the ring factor), true of the default shape.
func epLayoutBytes(b layoutBench, n int, step metricLine) float64 {
	return epCommBytes(layoutMoE(b, n), n, 1, step.ExpertRows)
}

// epTPLayoutBytes is the ep N × tp 2 row's formula (dp = ep = N, 2N
// ranks; rank 0 is tp rank 0 of dp rank 0). Over its tp group (2 ranks,
// where an all-reduce of any size sends its buffer once): tp.StepBytes
// of the dense model, less each MoE block's dense MLP all-reduces (V
// forward, V backward, e bytes an element), plus its experts': each
// expert is split like the dense MLP, so each of rank 0's experts
// all-reduces its output rows forward and its input's gradient backward,
// 2·e·C·rows for the rows rank 0's experts processed in the step (with
// ep = dp, the tokens the step's expert_load gives its experts, every
// rank's routed to them). Over its expert-parallel group (the N dp ranks
// of tp rank 0): the routing's bytes of epCommBytes (the exchanged rows
// in float32, counts, the aux statistics, expert_load), DDP's all-reduce
// of the non-expert parameters of a tp rank (tp.Estimator's parts) and
// the loss; and the gradient norm over all 2N ranks.
func epTPLayoutBytes(b layoutBench, n int, step metricLine) float64 {
	m := layoutMoE(b, n)
	const tpN = 2
	e, C := float64(b.act()), float64(m.NEmbd)
	seqs := b.global / n
	V := float64(seqs*m.BlockSize) * C
	blocks := float64(moeBlocks(m))
	local := m.MoE.Experts / n // rank 0's experts: [0, local)
	var rows float64
	for _, load := range step.ExpertLoad {
		for _, r := range load[:local] {
			rows += r
		}
	}
	tpBytes := tp.StepBytes(m, seqs, 1, tpN, false, b.act()) - blocks*2*e*V + 2*e*C*rows
	var psi int64
	for _, p := range (tp.Estimator{N: tpN}).LocalParams(trainer.EstimateInput{}, m.ParamShapes()) {
		if _, ok := nn.ExpertOf(p.Name); !ok {
			k := int64(1)
			for _, d := range p.Shape {
				k *= int64(d)
			}
			psi += k
		}
	}
	norm := 16.0
	if b.precision == "fp16" {
		norm = 24
	}
	return tpBytes + epRoutingBytes(m, n, 1, step.ExpertRows) + arBytes(n, 4*float64(psi)) + arBytes(n, 8) + arBytes(tpN*n, norm)
}

// ppMicro is the micro-batches per step (train.grad_accum) of the pipeline
// rows: the global batch is split into them, so every row still trains the
// same sequences per step.
const ppMicro = 4

var ppMicroFlag = " --train.grad_accum=" + strconv.Itoa(ppMicro)

// ppCommBytes: rank 0 holds the first stage's v chunks. Each of the m
// micro-batches sends the output activation (b·s·h floats, b = the
// micro-batch's sequences) of every one of its chunks forward, and the
// input gradient of every chunk but chunk 0 backward: (2v-1)·m·b·s·h·e
// bytes (e = 4 in float32, 2 under --precision bf16/fp16). The tied wte's gradient is summed over the first and last stage
// (an all-reduce of vocab·h floats) and the norm is all-reduced; the loss
// is broadcast from the last stage, which rank 0 receives.
func ppCommBytes(v int) func(b layoutBench, n int) float64 {
	return func(b layoutBench, n int) float64 {
		micro := float64(b.global / ppMicro)
		act := micro * float64(b.model.BlockSize*b.model.NEmbd) * float64(b.act())
		wte := float64(b.model.VocabSize*b.model.NEmbd) * 4
		return float64((2*v-1)*ppMicro)*act + wte + b.normBytes(n)
	}
}

// layoutBench is the model and global batch every row trains.
type layoutBench struct {
	model     nn.GPTConfig
	global    int    // sequences per step
	precision string // train.mixed_precision of every row: no, bf16, fp16
}

// act is e, the bytes of an activation element on the wire: 4, or 2 under
// mixed precision, where activations travel in the compute dtype.
func (b layoutBench) act() int {
	if b.precision == "bf16" || b.precision == "fp16" {
		return 2
	}
	return 4
}

// flags registers the model's shape (defaults def), --batch (the global
// batch, default batch) and --keep, which it returns: where the runs'
// files stay.
func (b *layoutBench) flags(fs *flag.FlagSet, def nn.GPTConfig, batch int) (keep *string) {
	gptFlags(fs, &b.model, def)
	fs.IntVar(&b.global, "batch", batch, "global batch (sequences per step)")
	return fs.String("keep", "", "directory to keep the runs' metrics and traces in (default: a temporary one)")
}

// parse parses args and checks the model's shape.
func (b *layoutBench) parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := b.model.Validate(); err != nil {
		return fmt.Errorf("%s: %w", fs.Name(), err)
	}
	return nil
}

// normBytes is what a rank sends for the gradient norm's all-reduce over
// the world of w ranks: the sum of squares and the stop flag, two float64,
// and under fp16 a third, the overflow flag of loss scaling.
func (b layoutBench) normBytes(w int) float64 {
	k := 16.0
	if b.precision == "fp16" {
		k = 24
	}
	return 2 * float64(w-1) / float64(w) * k
}

// dpCommBytes: plain data parallel all-reduces every gradient once per step
// (4Ψ bytes, factor 2(N-1)/N) and the loss (one float64), plus the norm.
func dpCommBytes(b layoutBench, n int) float64 {
	ar := 2 * float64(n-1) / float64(n)
	return ar*4*float64(b.model.NumParams()) + ar*8 + b.normBytes(n)
}

// zeroCommBytes is zero.StepBytes for one micro-batch a step, the
// parameters gathered in e bytes (the 2-byte copies under mixed
// precision), the gradients reduced in 4, plus the loss's mean and the
// norm.
func zeroCommBytes(stage int) func(b layoutBench, n int) float64 {
	return func(b layoutBench, n int) float64 {
		return zero.StepBytes(b.model, stage, 1, n, 4, b.act()) + 2*float64(n-1)/float64(n)*8 + b.normBytes(n)
	}
}

// tpCommBytes is tp.StepBytes for the whole global batch (tensor parallel
// ranks share their micro-batch) plus the norm.
func tpCommBytes(sp bool) func(b layoutBench, n int) float64 {
	return func(b layoutBench, n int) float64 {
		return tp.StepBytes(b.model, b.global, 1, n, sp, b.act()) + b.normBytes(n)
	}
}

// benchLayouts trains one model on one global batch under every layout of
// layoutRows, each as its own job of `tinyacc train` processes over tcp,
// the rows taking turns for --repeats rounds so machine noise hits all
// alike, and prints one table: median ms/step and tokens/s (the first
// step not timed), the bytes rank 0 sent per step (comm.ByteCounter: the
// payload its collectives moved, on every group) beside the formula, the
// parameter bytes of rank 0 and its activation peak (the allocator's) as a
// ratio to one process's.
//
// The formulas, in bytes sent per rank per step, with ring factors
// 2(N-1)/N for an all-reduce and (N-1)/N of the whole buffer for an
// all-gather or a reduce-scatter (docs/formulas.md); L layers, width h,
// context s, b sequences per rank per micro-batch, V = b·s·h, Ψ parameters,
// e the bytes of an activation element: 4 in float32; 2 under --precision
// bf16 or fp16, where activations and their gradients travel in the
// compute dtype (pipeline sends, TP/SP collectives, the CP ring's blocks,
// its all-gather and reduce-scatter), so those terms halve. Parameter
// gradients, the loss, the cross-entropy's statistics and the norm stay
// 4-byte:
//
//	dp N       2(N-1)/N · (4Ψ + 8)                      gradients and the loss
//	zero-1 N   (N-1)/N · (4 + e)·P + 2(N-1)/N · 8        the gradients reduce-scattered, the parameters
//	                                                     gathered (2-byte copies under bf16/fp16), the loss
//	zero-3 N   (N-1)/N · (4P + e·(P + E + B)) + ...      the parameters gathered for the forward, the embed
//	                                                     unit E for the tied head, the blocks B for the
//	                                                     backward (zero.StepBytes: P, E, B padded units)
//	tp N       2(N-1)/N · (e·(4L + 2)·V + 4·3·b·s)       per layer V all-reduced twice forward and twice
//	                                                     backward; the embedding, the head's input gradient
//	                                                     and three b·s cross-entropy reductions
//	tp N + SP  (N-1)/N · e · (8L + 4)·V                  the same volume as all-gathers and reduce-scatters
//	           + 2(N-1)/N · 4 · (3·b·s + (6L + 2)·h + s·h)   the cross-entropy, and the summed gradients
//	                                                     of ln_1, ln_2, the row-parallel biases, ln_f, wpe
//	pp N       (2v-1)·m·e·V + 4·vocab·h                  activations forward and gradients backward of the
//	                                                     first stage's v chunks over m micro-batches; the
//	                                                     tied wte's gradient summed with the last stage
//	ep N       2·4h·rows + all-to-all counts,            every block a mixture of N experts (top-2): the
//	           statistics, and 2(N-1)/N · 4Ψr            token rows the routing sent and received, each
//	                                                     crossing twice; Ψr the non-expert parameters
//	                                                     (epCommBytes in bench_ep.go has every term)
//	ep N ×     tp 2's (e·(4L+2)·V + 4·3·b·s)             the ep N row's model on 2N ranks (dp = ep = N):
//	tp 2       − e·2L·V + 2·e·h·R                        over the tp group the dense formula less the MLP's
//	           + the ep N row's routing terms            all-reduces, plus each expert's of its R rows (the
//	           + AR(4Ψr/tp) + AR(8) + AR over 2N (16)    step's expert_load of rank 0's experts); over the
//	                                                     ep group the routing as above and a tp rank's
//	                                                     non-expert parameters; the norm over all 2N ranks
//	                                                     (epTPLayoutBytes)
//
// each plus 2(N-1)/N · 16 for the gradient norm (24 under fp16, whose
// overflow flag travels with it; see tp.StepBytes). With
// N = 2 the direct algorithms the comm layer uses for small buffers send
// exactly these amounts; for larger N a small all-reduce sends (N-1)·n.
func benchLayouts(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench layouts", flag.ContinueOnError)
	nproc := fs.Int("nproc", 2, "ranks of the parallel layouts")
	steps := fs.Int("steps", 6, "training steps per run (the first is not timed)")
	repeats := fs.Int("repeats", 3, "interleaved runs of every layout (medians are reported)")
	var b layoutBench
	fs.StringVar(&b.precision, "precision", "no", "train.mixed_precision of every row: no (float32), bf16 or fp16")
	keep := b.flags(fs, nn.GPTConfig{NLayer: 4, NHead: 4, NEmbd: 256, BlockSize: 256, VocabSize: 256}, 8)
	if err := b.parse(fs, args); err != nil {
		return err
	}
	n := *nproc
	if b.precision != "no" && b.act() != 2 {
		return fmt.Errorf("bench layouts: --precision %q: use no, bf16 or fp16", b.precision)
	}
	if n < 2 {
		return fmt.Errorf("bench layouts: --nproc %d: the parallel layouts need 2 or more ranks", n)
	}
	dir, exe, done, err := benchFiles(*keep, "layouts")
	if err != nil {
		return err
	}
	defer done()
	type job struct {
		name  string
		procs int
		argv  []string
	}
	jobs := make([]job, len(layoutRows))
	for i, row := range layoutRows {
		nd := strings.NewReplacer("%d", strconv.Itoa(n))
		j := job{name: nd.Replace(row.name), procs: 1}
		var flags []string
		if row.flags != "" {
			j.procs = n
			flags = strings.Fields(nd.Replace(row.flags))
		}
		if row.routed != nil {
			j.procs = n * row.routed.tp
		}
		cfg, err := config.Load("", nil, flags)
		if err != nil {
			return fmt.Errorf("bench layouts: row %q: %w", j.name, err)
		}
		c := cfg.Config
		dp := j.procs / (c.Parallel.TP * c.Parallel.PP * c.Parallel.CP)
		accum := c.Train.GradAccum
		if dp < 1 || b.global%(dp*accum) != 0 {
			return fmt.Errorf("bench layouts: row %q: a global batch of %d does not split over %d data-parallel ranks × %d micro-batches", j.name, b.global, dp, accum)
		}
		j.argv = trainArgs(exe, b.model, b.global/(dp*accum), *steps, append([]string{"--train.schedule=constant", "--train.mixed_precision=" + b.precision}, flags...)...)
		if err := c.CheckWorld(j.procs); err != nil {
			return fmt.Errorf("bench layouts: row %q: %w", j.name, err)
		}
		jobs[i] = j
	}
	fmt.Fprintf(stdout, "GPT n_layer %d n_head %d n_embd %d context %d vocab %d: Ψ = %.2fM parameters; global batch %d sequences; %d steps x %d interleaved repeats; tcp backend; mixed precision %s (activations on the wire: %d bytes)\n",
		b.model.NLayer, b.model.NHead, b.model.NEmbd, b.model.BlockSize, b.model.VocabSize, float64(b.model.NumParams())/1e6, b.global, *steps, *repeats, b.precision, b.act())
	results := make([]layoutResult, len(jobs))
	for r := 0; r < *repeats; r++ {
		for i, j := range jobs {
			tag := fmt.Sprintf("%s-%d", strings.NewReplacer(" ", "", "+", "-").Replace(j.name), r)
			metrics := filepath.Join(dir, tag+".jsonl")
			argv := append(append([]string(nil), j.argv...), "--metrics_file="+metrics)
			if err := launchTrain("layouts", tag, j.procs, argv, stderr); err != nil {
				return err
			}
			var formula func(metricLine) float64
			if row := layoutRows[i]; row.routed != nil {
				formula = func(step metricLine) float64 { return row.routed.bytes(b, n, step) }
			}
			m, err := readLayoutMetrics(metrics, formula)
			if err != nil {
				return err
			}
			results[i].add(m)
		}
	}
	base := results[0].median().act
	fmt.Fprintf(stdout, "%-18s %9s %10s %14s %14s %9s %14s %9s\n", "layout", "ms/step", "tokens/s", "comm B/step", "formula B", "diff", "param B/rank", "act peak")
	var off []string
	for i, row := range layoutRows {
		m := results[i].median()
		formula, diff := "-", "-"
		if row.comm != nil || row.routed != nil {
			var f float64
			if row.comm != nil {
				f = row.comm(b, n)
			} else {
				f = m.formula
			}
			formula = fmt.Sprintf("%.0f", f)
			switch {
			case f > 0:
				d := (m.comm - f) / f
				diff = fmt.Sprintf("%+.3f%%", 100*d)
				if !(d >= -0.01 && d <= 0.01) {
					off = append(off, fmt.Sprintf("%s sends %.0f bytes per step, %s from the formula's %.0f", jobs[i].name, m.comm, diff, f))
				}
			case m.comm == 0:
				diff = "0"
			default:
				off = append(off, fmt.Sprintf("%s sends %.0f bytes per step; the formula says none", jobs[i].name, m.comm))
			}
		}
		fmt.Fprintf(stdout, "%-18s %9.1f %10.0f %14.0f %14s %9s %14.0f %8.3fx\n", jobs[i].name, m.ms, m.tps, m.comm, formula, diff, m.params, m.act/base)
	}
	fmt.Fprintln(stdout, "comm: payload bytes rank 0 sent per step on every group (collectives as run); formula: the doc of benchLayouts (cmd/tinyacc/bench_layouts.go), tp.StepBytes")
	fmt.Fprintln(stdout, "param B/rank: rank 0's parameter bytes; act peak: rank 0's activation peak (allocator) over one process's")
	if len(off) > 0 {
		return fmt.Errorf("bench layouts: measured communication differs from the formula by more than 1%%: %s", strings.Join(off, "; "))
	}
	return nil
}

// layoutMetrics is what one run of a layout reports; formula is a MoE
// row's (moeRow.bytes), taken over the same steps as comm.
type layoutMetrics struct{ ms, tps, comm, params, act, formula float64 }

type layoutResult struct{ runs []layoutMetrics }

func (r *layoutResult) add(m layoutMetrics) { r.runs = append(r.runs, m) }

// median is the per-field median over the runs.
func (r *layoutResult) median() layoutMetrics {
	field := func(f func(layoutMetrics) float64) float64 {
		var xs []float64
		for _, m := range r.runs {
			xs = append(xs, f(m))
		}
		return median(xs)
	}
	return layoutMetrics{
		ms:      field(func(m layoutMetrics) float64 { return m.ms }),
		tps:     field(func(m layoutMetrics) float64 { return m.tps }),
		comm:    field(func(m layoutMetrics) float64 { return m.comm }),
		params:  field(func(m layoutMetrics) float64 { return m.params }),
		act:     field(func(m layoutMetrics) float64 { return m.act }),
		formula: field(func(m layoutMetrics) float64 { return m.formula }),
	}
}

// readLayoutMetrics returns the medians of a metrics file's timed steps
// (the first is not) and rank 0's memory entry; of formula's value on
// each timed step too, when given.
func readLayoutMetrics(path string, formula func(metricLine) float64) (layoutMetrics, error) {
	var out layoutMetrics
	lines, err := readMetrics(path)
	if err != nil {
		return out, err
	}
	var ms, tps, comm, fs []float64
	mem := false
	for _, m := range lines {
		switch {
		case m.Kind == "train" && m.Step > 1:
			ms, tps, comm = append(ms, m.StepMS), append(tps, m.TPS), append(comm, m.Comm)
			if formula != nil {
				fs = append(fs, formula(m))
			}
		case m.Kind == "memory" && m.Rank == 0:
			out.params, out.act, mem = m.Params, m.Act, true
		}
	}
	if len(ms) == 0 || !mem {
		return out, fmt.Errorf("%s: no timed steps or no memory entry (train.steps must be 2 or more)", path)
	}
	out.ms, out.tps, out.comm = median(ms), median(tps), median(comm)
	if formula != nil {
		out.formula = median(fs)
	}
	return out, nil
}
