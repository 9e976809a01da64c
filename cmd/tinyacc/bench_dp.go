package main

import (
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/trace"
)

// dpVariant is one data-parallel configuration of `bench dp`.
type dpVariant struct {
	name  string
	flags []string
	stage int
}

var dpVariants = []dpVariant{
	{"ddp naive", []string{"--ddp.mode=naive", "--zero.stage=0"}, 0},
	{"ddp bucketed", []string{"--ddp.mode=bucketed", "--zero.stage=0"}, 0},
	{"zero-1", []string{"--zero.stage=1"}, 1},
	{"zero-2", []string{"--zero.stage=2"}, 2},
	{"zero-3", []string{"--zero.stage=3"}, 3},
}

// benchDP trains the same GPT with every data-parallel variant on N tcp
// processes and prints ms/step, the share of communication hidden behind
// compute (from rank 0's trace) and rank 0's steady memory beside the
// fp32 AdamW formula (params 4Ψ, grads 4Ψ, moments 8Ψ, divided by N where
// the stage shards them; docs/formulas.md).
func benchDP(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench dp", flag.ContinueOnError)
	nprocs := fs.String("nproc", "2,4", "data-parallel sizes")
	steps := fs.Int("steps", 10, "training steps per run (the first is not timed)")
	repeats := fs.Int("repeats", 3, "interleaved runs of every variant (medians are reported)")
	var gc nn.GPTConfig
	gptFlags(fs, &gc, nn.GPTConfig{NLayer: 6, NHead: 6, NEmbd: 384, BlockSize: 128, VocabSize: 256})
	batch := fs.Int("batch", 4, "per-rank micro-batch")
	bucket := fs.Float64("bucket_mb", 4, "ddp bucket size (MiB)")
	keep := fs.String("keep", "", "directory to keep metrics and traces in (default: a temporary one)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dir, exe, done, err := benchFiles(*keep, "dp")
	if err != nil {
		return err
	}
	defer done()
	psi := float64(gc.NumParams())
	fmt.Fprintf(stdout, "GPT n_layer %d n_embd %d context %d: Ψ = %.2fM parameters; per-rank batch %d; %d steps x %d interleaved repeats; tcp backend\n",
		gc.NLayer, gc.NEmbd, gc.BlockSize, psi/1e6, *batch, *steps, *repeats)
	fmt.Fprintf(stdout, "%4s %-13s %9s %8s %12s %12s %12s %10s\n", "dp", "variant", "ms/step", "hidden", "steady MiB", "formula MiB", "+buffers MiB", "vs both")
	for _, f := range strings.Split(*nprocs, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 {
			return fmt.Errorf("bench dp: --nproc %q: want sizes of 2 or more", *nprocs)
		}
		type result struct{ ms, hidden, mem []float64 }
		results := make([]result, len(dpVariants))
		// Variants take turns, repeats times, so machine noise hits all alike.
		for r := 0; r < *repeats; r++ {
			for i, v := range dpVariants {
				tag := fmt.Sprintf("dp%d-%s-%d", n, strings.ReplaceAll(v.name, " ", "-"), r)
				metrics := filepath.Join(dir, tag+".jsonl")
				tracePath := filepath.Join(dir, tag+".json")
				argv := trainArgs(exe, gc, *batch, *steps, append([]string{
					"--ddp.bucket_mb=" + strconv.FormatFloat(*bucket, 'g', -1, 64),
					"--metrics_file=" + metrics, "--trace=" + tracePath}, v.flags...)...)
				if err := launchTrain("dp", tag, n, argv, stderr); err != nil {
					return err
				}
				ms, mem, err := readDPMetrics(metrics)
				if err != nil {
					return err
				}
				hidden, err := hiddenCommShare(tracePath)
				if err != nil {
					return err
				}
				res := &results[i]
				res.ms, res.hidden, res.mem = append(res.ms, ms), append(res.hidden, hidden), append(res.mem, mem)
			}
		}
		for i, v := range dpVariants {
			res := results[i]
			ms, hidden, mem := median(res.ms), median(res.hidden), median(res.mem)
			formula := dpFormulaBytes(psi, n, v.stage)
			want := formula + zeroWorkingSet(gc, v.stage)
			fmt.Fprintf(stdout, "%4d %-13s %9.1f %7.0f%% %12.2f %12.2f %12.2f %+9.1f%%\n", n, v.name, ms, 100*hidden,
				mem/(1<<20), formula/(1<<20), want/(1<<20), 100*(mem-want)/want)
		}
	}
	fmt.Fprintln(stdout, "hidden: share of rank 0's communication time that overlaps forward/backward/optimizer spans")
	fmt.Fprintln(stdout, "steady: rank 0's params + grads + optimizer state; formula: 4Ψ + 4Ψ + 8Ψ, sharded by N per ZeRO stage")
	fmt.Fprintln(stdout, "+buffers: the formula plus ZeRO's documented working set (plugins/zero/doc.go): the full gradients (stage 2)")
	fmt.Fprintln(stdout, "  and gathered parameters (stage 3) of the embed unit and two blocks in flight; padding is not counted")
	return nil
}

// dpFormulaBytes is fp32 AdamW's steady memory per rank for a ZeRO stage.
func dpFormulaBytes(psi float64, n, stage int) float64 {
	p, g, o := 4*psi, 4*psi, 8*psi
	N := float64(n)
	if stage >= 1 {
		o /= N
	}
	if stage >= 2 {
		g /= N
	}
	if stage >= 3 {
		p /= N
	}
	return p + g + o
}

// zeroWorkingSet is the transient memory plugins/zero documents beside the
// formula: stage 2 holds the full gradients of the embed unit (the tied
// head's contribution to wte's) and of two adjacent blocks (one computed,
// one being reduce-scattered); stage 3 also holds gathered parameters: two
// adjacent blocks, or wte with the head's ln_f and the last block
// prefetched during the head's backward.
func zeroWorkingSet(c nn.GPTConfig, stage int) float64 {
	C := float64(c.NEmbd)
	embed := float64(c.VocabSize+c.BlockSize) * C
	block := 12*C*C + 13*C
	t := 4 * (embed + 2*block)
	switch stage {
	case 2:
		return t
	case 3:
		return t + 4*max(2*block, embed+block+2*C)
	}
	return 0
}

// readDPMetrics returns the median step time (first step excluded) and rank
// 0's steady params+grads+optimizer bytes from a metrics file.
func readDPMetrics(path string) (msPerStep, steadyBytes float64, err error) {
	lines, err := readMetrics(path)
	if err != nil {
		return 0, 0, err
	}
	var times []float64
	for _, m := range lines {
		switch {
		case m.Kind == "train" && m.Step > 1:
			times = append(times, m.StepMS)
		case m.Kind == "memory" && m.Rank == 0:
			steadyBytes = m.Params + m.Grads + m.Optim
		}
	}
	if len(times) == 0 || steadyBytes == 0 {
		return 0, 0, fmt.Errorf("%s: no timed steps or no memory entry", path)
	}
	return median(times), steadyBytes, nil
}

// hiddenCommShare reads a run's merged trace and returns the fraction of
// rank 0's time spent in comm spans that overlaps its compute spans.
func hiddenCommShare(path string) (float64, error) {
	ranks, err := trace.ReadRanks(path)
	if err != nil {
		return 0, err
	}
	return HiddenShare(ranks[0]), nil
}

// HiddenShare is Σ overlap(comm span, compute spans) / Σ comm span length.
func HiddenShare(evs []trace.Event) float64 {
	type iv struct{ a, b float64 }
	var compute []iv
	for _, e := range evs {
		if e.Ph == "X" && e.TID == trace.Compute {
			compute = append(compute, iv{e.TS, e.TS + e.Dur})
		}
	}
	sort.Slice(compute, func(i, j int) bool { return compute[i].a < compute[j].a })
	// merge into disjoint intervals
	var merged []iv
	for _, c := range compute {
		if n := len(merged); n > 0 && c.a <= merged[n-1].b {
			merged[n-1].b = max(merged[n-1].b, c.b)
		} else {
			merged = append(merged, c)
		}
	}
	var total, hidden float64
	for _, e := range evs {
		if e.Ph != "X" || e.TID != trace.Comm {
			continue
		}
		a, b := e.TS, e.TS+e.Dur
		total += b - a
		for _, c := range merged {
			lo, hi := max(a, c.a), min(b, c.b)
			if hi > lo {
				hidden += hi - lo
			}
		}
	}
	if total == 0 {
		return 0
	}
	return hidden / total
}
