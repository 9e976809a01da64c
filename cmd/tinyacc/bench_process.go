package main

import (
	"flag"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/tinyacc/tinyacc/plugins/process"
	"github.com/tinyacc/tinyacc/pluginsdk"
)

// benchProcess measures what running a plugin as a process costs: the
// round trip of one hook call (median over many empty calls to a DDP
// plugin process), what one GradReady notice costs the trainer (median
// time to write one to the pipe; the process reads them meanwhile, and
// the calls are not waited for, as in backward), and ms/step of the default model on 2 data-parallel
// processes with DDP compiled in and with ddp.process: true, run in turns
// so machine noise hits both alike.
func benchProcess(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench process", flag.ContinueOnError)
	fs.SetOutput(stderr)
	calls := fs.Int("calls", 10000, "hook round trips to time")
	steps := fs.Int("steps", 12, "training steps per run (the first is not timed)")
	rounds := fs.Int("rounds", 2, "runs of each form, taken in turns")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dir, exe, done, err := benchFiles("", "process")
	if err != nil {
		return err
	}
	defer done()
	p, err := process.Start(exe, process.Options{Env: []string{pluginsdk.BuiltinEnv + "=ddp"}, Rank: 0})
	if err != nil {
		return err
	}
	rtt := make([]float64, *calls)
	for i := range rtt {
		start := time.Now()
		if err := p.Ping(); err != nil {
			p.Close()
			return err
		}
		rtt[i] = float64(time.Since(start).Nanoseconds()) / 1e3
	}
	notice := make([]float64, *calls)
	for i := range notice {
		start := time.Now()
		if err := p.Notice(); err != nil {
			p.Close()
			return err
		}
		notice[i] = float64(time.Since(start).Nanoseconds()) / 1e3
	}
	err = p.Ping() // waits until the process has read every notice
	p.Close()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "hook round trip: median %.1f µs over %d calls\n", median(rtt), *calls)
	fmt.Fprintf(stdout, "GradReady notice (one way): median %.1f µs over %d notices\n", median(notice), *calls)

	forms := []struct{ name, flag string }{{"compiled", "--ddp.process=false"}, {"process", "--ddp.process=true"}}
	ms := map[string][]float64{}
	for r := range *rounds {
		for _, f := range forms {
			metrics := filepath.Join(dir, fmt.Sprintf("%s-%d.jsonl", f.name, r))
			cmd := exec.Command(exe, "train", "--nproc", "2", f.flag, "--train.steps="+strconv.Itoa(*steps),
				"--train.eval_every=0", "--metrics_file="+metrics)
			cmd.Stdout, cmd.Stderr = io.Discard, stderr
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("bench process: %s run: %w", f.name, err)
			}
			got, err := stepMS(metrics)
			if err != nil {
				return err
			}
			ms[f.name] = append(ms[f.name], got...)
		}
	}
	c, q := median(ms["compiled"]), median(ms["process"])
	fmt.Fprintf(stdout, "default model, dp 2 (--nproc 2), median ms/step over %d steps:\n", len(ms["compiled"]))
	fmt.Fprintf(stdout, "  %-22s %8.1f\n  %-22s %8.1f  (%+.1f%%)\n", "ddp compiled", c, "ddp.process: true", q, 100*(q-c)/c)
	return nil
}

// stepMS reads the step times of a metrics file, the first step excepted.
func stepMS(path string) ([]float64, error) {
	lines, err := readMetrics(path)
	if err != nil {
		return nil, err
	}
	var out []float64
	for _, m := range lines {
		if m.Kind == "train" {
			out = append(out, m.StepMS)
		}
	}
	if len(out) < 2 {
		return nil, fmt.Errorf("bench process: %s holds %d steps; ask for more with --steps", path, len(out))
	}
	return out[1:], nil
}
