package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strconv"
	"strings"
)

// precisionResult is one precision of `bench precision`.
type precisionResult struct {
	Precision string `json:"mixed_precision"`
	Steps     int    `json:"steps"`
	// FinalLoss is the last step's training loss, MeanLast10 the mean of
	// the last 10 steps', EvalLoss the last evaluation's (0 without one).
	FinalLoss  float64 `json:"final_loss"`
	MeanLast10 float64 `json:"mean_last10_loss"`
	EvalLoss   float64 `json:"eval_loss"`
	// VsNo is each loss's relative difference from the float32 run's
	// (train.mixed_precision=no), final step and evaluation.
	VsNo     float64 `json:"final_rel_vs_fp32"`
	EvalVsNo float64 `json:"eval_rel_vs_fp32"`
	StepMS   float64 `json:"median_step_ms"`
}

// benchPrecision trains the demo model (the defaults: 4 blocks, 128 wide,
// context 128, 300 steps) once per train.mixed_precision from the same
// seed and data, and prints each run's final losses beside the float32
// run's, with the relative difference and whether it is within --within
// (the claim: bf16 ends within 2% of fp32's final loss).
func benchPrecision(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench precision", flag.ContinueOnError)
	fs.SetOutput(stderr)
	steps := fs.Int("steps", 300, "training steps of each run")
	precFlag := fs.String("precision", "no,bf16,fp16", "train.mixed_precision values to run; the first must be no, the reference")
	within := fs.Float64("within", 0.02, "relative difference from fp32's final loss that passes")
	asJSON := fs.Bool("json", false, "print one JSON object per precision")
	keep := fs.String("keep", "", "directory to keep the runs' metrics in (default: a temporary one)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	precs := strings.Split(*precFlag, ",")
	for _, p := range precs {
		if p != "no" && p != "bf16" && p != "fp16" {
			return fmt.Errorf("bench precision: --precision %q: want no, bf16 or fp16, comma-separated, no first", *precFlag)
		}
	}
	if precs[0] != "no" || *steps < 10 {
		return fmt.Errorf("bench precision: --precision %q --steps %d: the first precision must be no (the reference) and steps at least 10", *precFlag, *steps)
	}
	dir, exe, done, err := benchFiles(*keep, "precision")
	if err != nil {
		return err
	}
	defer done()
	extra := fs.Args() // train flags after --, e.g. a model shape
	var out []precisionResult
	for _, p := range precs {
		metrics := filepath.Join(dir, p+".jsonl")
		argv := append([]string{exe, "train", "--train.steps=" + strconv.Itoa(*steps), "--train.mixed_precision=" + p,
			"--metrics_file=" + metrics}, extra...)
		if err := launchTrain("precision", p, 1, argv, stderr); err != nil {
			return err
		}
		lines, err := readMetrics(metrics)
		if err != nil {
			return err
		}
		r := precisionResult{Precision: p, Steps: *steps}
		var train, ms []float64
		for _, l := range lines {
			switch l.Kind {
			case "train":
				train = append(train, l.Loss)
				ms = append(ms, l.StepMS)
			case "eval":
				r.EvalLoss = l.Loss
			}
		}
		if len(train) < 10 {
			return fmt.Errorf("bench precision: %s has %d train lines for %d steps", metrics, len(train), *steps)
		}
		r.FinalLoss = train[len(train)-1]
		for _, v := range train[len(train)-10:] {
			r.MeanLast10 += v / 10
		}
		r.StepMS = median(ms)
		r.VsNo = r.FinalLoss/nonzero(out, func(x precisionResult) float64 { return x.FinalLoss }, r.FinalLoss) - 1
		r.EvalVsNo = r.EvalLoss/nonzero(out, func(x precisionResult) float64 { return x.EvalLoss }, r.EvalLoss) - 1
		out = append(out, r)
	}
	if *asJSON {
		return writeJSONLines(stdout, out)
	}
	fmt.Fprintf(stdout, "demo model (the defaults%s), %d steps per precision, same seed and data\n", strings.Join(append([]string{""}, extra...), " "), *steps)
	fmt.Fprintf(stdout, "%-10s %12s %12s %12s %12s %12s %10s %8s\n", "precision", "final loss", "mean last10", "vs fp32", "eval loss", "vs fp32", "ms/step", "within")
	for _, r := range out {
		ok := "yes"
		if math.Abs(r.VsNo) > *within {
			ok = "NO"
		}
		fmt.Fprintf(stdout, "%-10s %12.5f %12.5f %+11.3f%% %12.5f %+11.3f%% %10.1f %8s\n", r.Precision, r.FinalLoss, r.MeanLast10, 100*r.VsNo, r.EvalLoss, 100*r.EvalVsNo, r.StepMS, ok)
	}
	fmt.Fprintf(stdout, "within: |final loss / fp32's final loss - 1| <= %g\n", *within)
	return nil
}

// nonzero is the reference run's value (the first result's), or self for
// the reference itself.
func nonzero(out []precisionResult, f func(precisionResult) float64, self float64) float64 {
	if len(out) == 0 || f(out[0]) == 0 {
		return self
	}
	return f(out[0])
}
