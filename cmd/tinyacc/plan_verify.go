package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"

	"github.com/tinyacc/tinyacc/core/launch"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins"
	"github.com/tinyacc/tinyacc/plugins/plan"
)

// verifySteps are the steps each verified layout trains; the first
// verifyUntimed are not timed.
const verifySteps, verifyUntimed = 5, 2

// measured is what one verified run reports: the median step time of its
// timed steps (rank 0's step_ms), its ranks' largest allocator peak
// (peak_bytes) and their largest resident peak (rss_peak_bytes).
type measured struct {
	stepMS    float64
	allocPeak int64
	rssPeak   int64
}

// verifyPick is the top k of fits (fastest predicted first) and k more
// picked at random among the rest (a fixed seed, so a run is repeatable),
// in predicted order.
func verifyPick(fits []plan.Candidate, k int) []plan.Candidate {
	top := fits[:min(k, len(fits))]
	rest := append([]plan.Candidate(nil), fits[len(top):]...)
	r := rand.New(rand.NewPCG(1, 2))
	r.Shuffle(len(rest), func(i, j int) { rest[i], rest[j] = rest[j], rest[i] })
	pick := append(append([]plan.Candidate(nil), top...), rest[:min(k, len(rest))]...)
	sort.SliceStable(pick, func(i, j int) bool { return pick[i].Pred.Step < pick[j].Pred.Step })
	return pick
}

// planVerify runs the top --verify K layouts and K at random among those
// that fit, verifySteps steps each as a job of `train --nproc N` with the
// layout's flags, and prints predicted against measured ms/step and peak
// memory, the rank correlation of the step times (Spearman) and the
// median absolute error. --rounds R runs every layout R times, the
// layouts taking turns so that a busy machine's load falls on all alike,
// and takes the median run. --keep DIR keeps each run's metrics file
// (verify-I.jsonl for row I, verify-I-roundR.jsonl for later rounds).
//
// The peaks compared are the allocator's: the largest of the ranks'
// estimates (AllocPeakBytes) against the largest peak_bytes they report,
// which is what one layout changes against another. A process's estimate
// (the plan's peak/rank) adds the corpus, the runtime and the rings, the
// same in every layout and bounds rather than measures (the corpus at
// data.max_bytes when its size is known only once read), so it would be
// tens of MiB off the resident peak whatever the layout; the table gives
// the measured resident peak (rss_peak_bytes) beside, the figure
// memory.limit bounds.
func planVerify(fits []plan.Candidate, f planFlags, blockSize int, stdout, stderr io.Writer) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	dir := f.keep
	if dir == "" {
		if dir, err = os.MkdirTemp("", "tinyacc-plan-verify"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	pick := verifyPick(fits, f.verify)
	preds := make([]int64, len(pick))
	for i, c := range pick {
		if preds[i], err = allocPeak(c); err != nil {
			return fmt.Errorf("plan verify: %s: %w", c.Name(), err)
		}
	}
	runs := make([][]measured, len(pick))
	for round := 1; round <= f.rounds; round++ {
		for i, c := range pick {
			name := fmt.Sprintf("verify-%d.jsonl", i+1)
			if round > 1 {
				name = fmt.Sprintf("verify-%d-round%d.jsonl", i+1, round)
			}
			metrics := filepath.Join(dir, name)
			argv := append([]string{exe, "train"}, layoutFlags(c, f.rest)...)
			argv = append(argv, fmt.Sprintf("--train.steps=%d", verifySteps), "--train.eval_every=0", "--train.eval_batches=1",
				"--train.log_every=1", "--save_to=", "--checkpoint.dir=", "--trace=", "--metrics_file="+metrics)
			fmt.Fprintf(stderr, "plan verify: round %d/%d, %d/%d %s\n", round, f.rounds, i+1, len(pick), c.Name())
			lo := launch.Options{NProc: f.nproc, Stdout: io.Discard, Stderr: stderr}
			if err := launch.Run(context.Background(), lo, argv); err != nil {
				return fmt.Errorf("plan verify: %s: %w", c.Name(), err)
			}
			m, err := readVerifyMetrics(metrics)
			if err != nil {
				return fmt.Errorf("plan verify: %s: %w", c.Name(), err)
			}
			runs[i] = append(runs[i], m)
		}
	}
	ms := make([]measured, len(pick))
	for i, rs := range runs {
		var steps []float64
		for _, r := range rs {
			steps = append(steps, r.stepMS)
			ms[i].allocPeak = max(ms[i].allocPeak, r.allocPeak)
			ms[i].rssPeak = max(ms[i].rssPeak, r.rssPeak)
		}
		ms[i].stepMS = median(steps)
	}
	rounds := ""
	if f.rounds > 1 {
		rounds = fmt.Sprintf("; %d interleaved rounds, the median run", f.rounds)
	}
	fmt.Fprintf(stdout, "verify: %d steps per layout (the first %d not timed), %d processes each%s\n", verifySteps, verifyUntimed, f.nproc, rounds)
	n := nameWidth(pick)
	fmt.Fprintf(stdout, "%-4s %-*s %12s %12s %8s %12s %12s %12s\n", "#", n, "layout", "pred ms", "meas ms", "error", "pred alloc", "meas alloc", "meas rss")
	var pred, meas, errs []float64
	best := 0
	for i, c := range pick {
		p, m := 1e3*c.Pred.Step, ms[i].stepMS
		pred, meas = append(pred, p), append(meas, m)
		errs = append(errs, math.Abs(p-m)/m)
		if m < ms[best].stepMS {
			best = i
		}
		fmt.Fprintf(stdout, "%-4d %-*s %12.1f %12.1f %+7.0f%% %12s %12s %12s\n", i+1, n, c.Name(), p, m, 100*(p-m)/m,
			trainer.FormatBytes(preds[i]), trainer.FormatBytes(ms[i].allocPeak), trainer.FormatBytes(ms[i].rssPeak))
	}
	fmt.Fprintf(stdout, "Spearman: %.3f\n", spearman(pred, meas))
	fmt.Fprintf(stdout, "median absolute error: %.1f%%\n", 100*median(errs))
	fmt.Fprintf(stdout, "first choice: %s, %.1f ms measured; fastest measured: %s, %.1f ms (%+.1f%%)\n",
		pick[0].Name(), ms[0].stepMS, pick[best].Name(), ms[best].stepMS, 100*(ms[0].stepMS-ms[best].stepMS)/ms[best].stepMS)
	return nil
}

// allocPeak is the largest allocator peak a rank of c is estimated to
// reach (AllocPeakBytes).
func allocPeak(c plan.Candidate) (int64, error) {
	es, err := plugins.Estimate(c.Config, c.World)
	if err != nil {
		return 0, err
	}
	var peak int64
	for _, e := range es {
		peak = max(peak, e.AllocPeakBytes())
	}
	return peak, nil
}

// readVerifyMetrics is a run's median step_ms over its timed steps and
// the largest peak_bytes and rss_peak_bytes of its ranks' memory lines.
func readVerifyMetrics(path string) (measured, error) {
	var out measured
	lines, err := readMetrics(path)
	if err != nil {
		return out, err
	}
	var steps []float64
	for _, m := range lines {
		switch {
		case m.Kind == "train" && m.Step > verifyUntimed:
			steps = append(steps, m.StepMS)
		case m.Kind == "memory":
			out.allocPeak = max(out.allocPeak, int64(m.Peak))
			out.rssPeak = max(out.rssPeak, int64(m.RSS))
		}
	}
	if len(steps) == 0 || out.rssPeak == 0 {
		return out, fmt.Errorf("%s: no timed steps or no memory line", path)
	}
	out.stepMS = median(steps)
	return out, nil
}

// spearman is the rank correlation of xs and ys: Pearson's correlation
// of their ranks, ties given their mean rank.
func spearman(xs, ys []float64) float64 {
	rx, ry := ranks(xs), ranks(ys)
	n := float64(len(xs))
	var mx, my float64
	for i := range rx {
		mx, my = mx+rx[i]/n, my+ry[i]/n
	}
	var sxy, sxx, syy float64
	for i := range rx {
		dx, dy := rx[i]-mx, ry[i]-my
		sxy, sxx, syy = sxy+dx*dy, sxx+dx*dx, syy+dy*dy
	}
	if sxx == 0 || syy == 0 {
		return math.NaN()
	}
	return sxy / math.Sqrt(sxx*syy)
}

func ranks(xs []float64) []float64 {
	idx := make([]int, len(xs))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return xs[idx[a]] < xs[idx[b]] })
	out := make([]float64, len(xs))
	for i := 0; i < len(idx); {
		j := i
		for j+1 < len(idx) && xs[idx[j+1]] == xs[idx[i]] {
			j++
		}
		for k := i; k <= j; k++ {
			out[idx[k]] = float64(i+j)/2 + 1
		}
		i = j + 1
	}
	return out
}
