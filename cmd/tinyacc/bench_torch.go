package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// benchTorch times one training step of the same ~10M-parameter torch
// model (bench/torch_ddp.py) on N ranks through tinyacc's Accelerator and
// through torch.nn.parallel.DistributedDataParallel on gloo, both started
// by `tinyacc launch`, the two sides alternating so machine noise hits
// both alike. It prints, per zero.stage, the median step time of each side
// and their ratio, and the per-rank gradient + optimizer-state bytes of
// each. Stages 1-3 appear when tinyacc.torch_zero imports.
func benchTorch(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench torch", flag.ContinueOnError)
	nproc := fs.Int("nproc", 2, "data-parallel ranks (processes)")
	steps := fs.Int("steps", 5, "timed steps per run")
	warmup := fs.Int("warmup", 2, "untimed steps before timing")
	repeats := fs.Int("repeats", 3, "alternating runs of each side per stage")
	batch := fs.Int("batch", 32, "samples per rank per step")
	threads := fs.Int("threads", 1, "torch threads per rank")
	script := fs.String("torch-script", "bench/torch_ddp.py", "the benchmark script (both sides)")
	python := fs.String("python", "/usr/bin/python3", "Python with torch")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *nproc < 2 || *repeats < 1 || *steps < 1 {
		return fmt.Errorf("bench torch: --nproc %d must be >= 2, --repeats %d and --steps %d >= 1", *nproc, *repeats, *steps)
	}
	dir, exe, done, err := benchFiles("", "torch")
	if err != nil {
		return err
	}
	defer done()
	stages := []int{0}
	if torchZeroAvailable(*python, *script) {
		stages = append(stages, 1, 2, 3)
	}

	run := func(side string, stage, rep int) (torchBenchRun, error) {
		out := filepath.Join(dir, fmt.Sprintf("%s-%d-%d", side, stage, rep))
		argv := []string{"launch", "--nproc", strconv.Itoa(*nproc), "--", *python, *script, "--side", side,
			"--stage", strconv.Itoa(stage), "--steps", strconv.Itoa(*steps), "--warmup", strconv.Itoa(*warmup),
			"--batch", strconv.Itoa(*batch), "--threads", strconv.Itoa(*threads), "--out", out}
		cmd := exec.Command(exe, argv...)
		cmd.Env = append(os.Environ(), "OMP_NUM_THREADS="+strconv.Itoa(*threads))
		var errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &errb, &errb
		if err := cmd.Run(); err != nil {
			return torchBenchRun{}, fmt.Errorf("bench torch: %s side, zero.stage %d: %v\n%s", side, stage, err, lastLines(errb.String(), 20))
		}
		return readTorchBench(out, *nproc)
	}

	fmt.Fprintf(stdout, "bench torch: the same torch model and loop on %d ranks (processes), %d samples/rank/step, %d thread(s)/rank; median of %d alternating runs x %d steps\n",
		*nproc, *batch, *threads, *repeats, *steps)
	fmt.Fprintf(stdout, "peer: torch.nn.parallel.DistributedDataParallel on gloo (gradient_as_bucket_view), step = forward + backward + AdamW step\n")
	var peer torchBenchRun
	for _, stage := range stages {
		var ta, pt []float64
		var tr torchBenchRun
		for rep := 0; rep < *repeats; rep++ {
			order := []string{"tinyacc", "ddp"}
			if rep%2 == 1 {
				order = []string{"ddp", "tinyacc"}
			}
			for _, side := range order {
				if side == "ddp" && stage > 0 {
					continue // the peer has no zero.stage: its stage-0 runs stand for every row
				}
				r, err := run(side, stage, rep)
				if err != nil {
					return err
				}
				if side == "tinyacc" {
					ta = append(ta, r.msStep())
					tr = r
				} else {
					pt = append(pt, r.msStep())
					peer.merge(r)
				}
			}
		}
		if stage == 0 {
			fmt.Fprintf(stdout, "model: %.2fM parameters, largest parameter %s\n\n", float64(tr.params)/1e6, human(tr.largest))
			fmt.Fprintf(stdout, "%-6s %12s %12s %8s %18s %18s %8s\n", "stage", "tinyacc ms", "ddp ms", "ratio", "tinyacc grad+opt", "ddp grad+opt", "ratio")
		}
		tm, pm := median(ta), median(peer.ms)
		tb, pb := tr.maxBytes(), peer.maxBytes()
		// The time ratio is the median of each run's ratio to the peer run
		// beside it (the same repeat), so load that drifts over the
		// benchmark cancels; other stages pair with the stage-0 peer runs.
		ratios := make([]float64, len(ta))
		for i := range ta {
			ratios[i] = ta[i] / peer.ms[i%len(peer.ms)]
		}
		fmt.Fprintf(stdout, "%-6d %12.1f %12.1f %8.2f %18s %18s %8.3f\n", stage, tm, pm, median(ratios), human(tb), human(pb), float64(tb)/float64(pb))
		fmt.Fprintf(stdout, "       runs (ms): tinyacc %s, ddp %s\n", fmtMS(ta), fmtMS(peer.ms))
		if stage == 2 {
			bound := pb/int64(*nproc) + tr.bucket + tr.largest
			fmt.Fprintf(stdout, "       zero.stage 2 target: grad+opt per rank <= ddp/%d + one bucket + largest parameter = %s: %s\n",
				*nproc, human(bound), map[bool]string{true: "met", false: "NOT met"}[tb <= bound])
		}
	}
	if len(stages) == 1 {
		fmt.Fprintf(stdout, "(zero.stage 1-3: tinyacc.torch_zero is not available in this build)\n")
	}
	fmt.Fprintf(stdout, "ratio: median over repeats of tinyacc/ddp for runs side by side (< 1: tinyacc faster); bytes ratio < 1: fewer bytes;\n")
	fmt.Fprintf(stdout, "grad+opt is the largest rank's gradient + optimizer-state bytes\n")
	return nil
}

// torchBenchRun is what the ranks of one run wrote.
type torchBenchRun struct {
	ms              []float64
	perRank         []int64
	params, largest int64
	bucket          int64
}

func (r torchBenchRun) msStep() float64 { return r.ms[len(r.ms)-1] }

func (r *torchBenchRun) merge(o torchBenchRun) {
	r.ms = append(r.ms, o.msStep())
	r.perRank, r.params, r.largest, r.bucket = o.perRank, o.params, o.largest, o.bucket
}

func (r torchBenchRun) maxBytes() int64 {
	var m int64
	for _, b := range r.perRank {
		m = max(m, b)
	}
	return m
}

func readTorchBench(dir string, nproc int) (torchBenchRun, error) {
	var out torchBenchRun
	for rank := 0; rank < nproc; rank++ {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank%d.json", rank)))
		if err != nil {
			return out, fmt.Errorf("bench torch: rank %d wrote no result: %v", rank, err)
		}
		var v struct {
			MS      float64 `json:"ms_step"`
			Grads   int64   `json:"grads_bytes"`
			Optim   int64   `json:"optim_bytes"`
			Params  int64   `json:"params"`
			Largest int64   `json:"largest_param_bytes"`
			Bucket  float64 `json:"bucket_bytes"`
		}
		if err := json.Unmarshal(b, &v); err != nil {
			return out, fmt.Errorf("bench torch: rank %d result: %v", rank, err)
		}
		if rank == 0 {
			out.ms = []float64{v.MS}
			out.params, out.largest, out.bucket = v.Params, v.Largest, int64(v.Bucket)
		}
		out.perRank = append(out.perRank, v.Grads+v.Optim)
	}
	return out, nil
}

// torchZeroAvailable reports whether the script's tinyacc package has the
// ZeRO engine for torch models.
func torchZeroAvailable(python, script string) bool {
	pkg := filepath.Join(filepath.Dir(filepath.Dir(script)), "python")
	cmd := exec.Command(python, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import tinyacc.torch_zero", pkg)
	return cmd.Run() == nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func fmtMS(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.FormatFloat(x, 'f', 1, 64)
	}
	return strings.Join(parts, " ")
}

// human formats bytes in MiB.
func human(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
