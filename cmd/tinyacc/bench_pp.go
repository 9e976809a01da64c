package main

import (
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/plugins/pp"
)

// PPLayout is one pipeline layout of `tinyacc train`: a name, the number
// of processes and the flags that select it.
type PPLayout struct {
	Name  string
	NProc int
	Flags []string
}

// PPLayouts are the pipeline layouts a table of layouts compares (two
// stages alone and beside two data-parallel replicas).
func PPLayouts() []PPLayout {
	return []PPLayout{
		{"pp2 1f1b", 2, []string{"--parallel.pp=2", "--pp.schedule=1f1b"}},
		{"pp2 zb1", 2, []string{"--parallel.pp=2", "--pp.schedule=zb1"}},
		{"pp2 interleaved v2", 2, []string{"--parallel.pp=2", "--pp.schedule=interleaved", "--pp.virtual_stages=2"}},
		{"pp2 x dp2 zero1", 4, []string{"--parallel.pp=2", "--zero.stage=1"}},
	}
}

// benchPP trains the same GPT on two tcp processes with every pipeline
// schedule and m micro-batches per step and prints ms/step, the idle share
// of wall time measured from the trace beside the simulator's (fed the
// measured mean F, B, W) and the formula's, and each stage's activation
// peak.
func benchPP(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench pp", flag.ContinueOnError)
	micros := fs.String("micro", "2,4,8", "micro-batches per step (train.grad_accum)")
	steps := fs.Int("steps", 6, "training steps per run (the first is not measured)")
	var gc nn.GPTConfig
	gptFlags(fs, &gc, nn.GPTConfig{NLayer: 4, NHead: 4, NEmbd: 256, BlockSize: 64, VocabSize: 256})
	batch := fs.Int("batch", 4, "micro-batch size")
	keep := fs.String("keep", "", "directory to keep metrics and traces in (default: a temporary one)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dir, exe, done, err := benchFiles(*keep, "pp")
	if err != nil {
		return err
	}
	defer done()
	const p = 2
	fmt.Fprintf(stdout, "GPT n_layer %d n_embd %d context %d, micro-batch %d; pp=2 on 2 tcp processes, 1 thread each; %d steps, the first not measured\n",
		gc.NLayer, gc.NEmbd, gc.BlockSize, *batch, *steps)
	fmt.Fprintf(stdout, "%-16s %3s %9s %10s %10s %10s %14s %14s\n", "schedule", "m", "ms/step", "idle trace", "idle sim", "idle formula", "act peak st0", "act peak st1")
	for _, f := range strings.Split(*micros, ",") {
		m, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || m < 1 {
			return fmt.Errorf("bench pp: --micro %q: want positive counts like 2,4,8", *micros)
		}
		for _, s := range []struct {
			name string
			v    int
		}{{pp.AFAB, 1}, {pp.OneFOneB, 1}, {pp.Interleaved, 2}, {pp.ZB1, 1}} {
			label := s.name
			if s.v > 1 {
				label = fmt.Sprintf("%s v%d", s.name, s.v)
			}
			tag := fmt.Sprintf("%s-v%d-m%d", s.name, s.v, m)
			metrics := filepath.Join(dir, tag+".jsonl")
			tracePath := filepath.Join(dir, tag+".json")
			argv := trainArgs(exe, gc, *batch, *steps,
				"--train.grad_accum="+strconv.Itoa(m), "--train.threads=1",
				"--parallel.pp=2", "--pp.schedule="+s.name, "--pp.virtual_stages="+strconv.Itoa(s.v),
				"--metrics_file="+metrics, "--trace="+tracePath)
			if err := launchTrain("pp", tag, p, argv, stderr); err != nil {
				return err
			}
			ms, peaks, err := readPPMetrics(metrics, p)
			if err != nil {
				return err
			}
			var measured, simulated []float64
			for step := 1; step < *steps; step++ {
				tr, err := tracedStep(tracePath, step)
				if err != nil {
					return err
				}
				sim := tr.Sim
				measured = append(measured, sim.IdleShare())
				sched, err := pp.Generate(s.name, p, s.v, m)
				if err != nil {
					return err
				}
				played, err := sched.SimulateChunks(chunkCosts(sim, sched.Split, tr.Latency, tr.SendBusy, tr.RecvBusy))
				if err != nil {
					return err
				}
				simulated = append(simulated, played.IdleShare())
			}
			fmt.Fprintf(stdout, "%-16s %3d %9.1f %9.1f%% %9.1f%% %11.1f%% %11.0f KiB %11.0f KiB\n", label, m, ms,
				100*median(measured), 100*median(simulated), 100*pp.IdleFormula(s.name, p, s.v, m), peaks[0]/1024, peaks[1]/1024)
		}
	}
	fmt.Fprintln(stdout, "idle: share of ranks × step time with no forward/backward running, from the pipeline spans of the trace (step 0 excluded, median);")
	fmt.Fprintln(stdout, "  not pp draw's bubble ratio, idle ÷ compute time ((p-1)/m for 1f1b): share = ratio/(1+ratio)")
	fmt.Fprintln(stdout, "sim: the schedule played with each chunk's mean F, B, W times and the median message latency, send and receive times of the run; formula: (p-1)/(m+p-1), (p-1)/(v·m+p-1) interleaved,")
	fmt.Fprintln(stdout, "  and for zb1 b/(1+b) with b = (p-1)/(3m); act peak: each stage's activation peak through its allocator")
	return nil
}

// chunkCosts are each model chunk's mean forward, backward and
// weight-gradient times in a traced step (chunks differ: the first embeds,
// the last runs the head and the loss); a schedule that does not split
// backward measured B+W as B. Every message takes the measured latency
// and keeps its sender, and its receiver, busy for the measured send and
// receive times.
func chunkCosts(sim *pp.Sim, split bool, latency, sendBusy, recvBusy float64) func(chunk int) pp.Costs {
	type acc struct {
		sum [3]float64
		n   [3]int
	}
	per := map[int]*acc{}
	for _, spans := range sim.Spans {
		for _, s := range spans {
			a := per[s.Chunk]
			if a == nil {
				a = &acc{}
				per[s.Chunk] = a
			}
			a.sum[s.Kind] += s.End - s.Start
			a.n[s.Kind]++
		}
	}
	return func(chunk int) pp.Costs {
		a := per[chunk]
		if a == nil {
			return pp.Costs{}
		}
		mean := func(k pp.Kind) float64 {
			if a.n[k] == 0 {
				return 0
			}
			return a.sum[k] / float64(a.n[k])
		}
		c := pp.Costs{F: mean(pp.Forward), B: mean(pp.Backward), L: latency, S: sendBusy, R: recvBusy}
		if split {
			c.W = mean(pp.Weight)
		}
		return c
	}
}

// readPPMetrics returns the median step time (first step excluded) and
// each rank's activation peak from a metrics file.
func readPPMetrics(path string, ranks int) (float64, []float64, error) {
	lines, err := readMetrics(path)
	if err != nil {
		return 0, nil, err
	}
	var times []float64
	peaks := make([]float64, ranks)
	for _, m := range lines {
		switch {
		case m.Kind == "train" && m.Step > 1:
			times = append(times, m.StepMS)
		case m.Kind == "memory" && m.Rank < ranks:
			peaks[m.Rank] = m.Act
		}
	}
	if len(times) == 0 {
		return 0, nil, fmt.Errorf("%s: no measured steps", path)
	}
	return median(times), peaks, nil
}
