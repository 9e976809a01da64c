package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/tinyacc/tinyacc/core/launch"
	"github.com/tinyacc/tinyacc/core/nn"
)

// trainArgs is the command line of a benchmark's `tinyacc train` run:
// the model m, batch sequences per rank and micro-batch, steps steps,
// random order over the whole corpus with no evaluation, then extra.
func trainArgs(exe string, m nn.GPTConfig, batch, steps int, extra ...string) []string {
	return append([]string{exe, "train",
		"--model.n_layer=" + strconv.Itoa(m.NLayer), "--model.n_head=" + strconv.Itoa(m.NHead),
		"--model.n_embd=" + strconv.Itoa(m.NEmbd), "--model.block_size=" + strconv.Itoa(m.BlockSize),
		"--model.vocab_size=" + strconv.Itoa(m.VocabSize),
		"--train.batch_size=" + strconv.Itoa(batch), "--train.steps=" + strconv.Itoa(steps),
		"--train.eval_every=0", "--data.val_fraction=0", "--data.order=random"}, extra...)
}

// launchTrain runs argv (trainArgs) as a job of procs tcp processes, saying
// so on stderr; bench and tag name the benchmark and the run in the
// progress line and in the error.
func launchTrain(bench, tag string, procs int, argv []string, stderr io.Writer) error {
	fmt.Fprintf(stderr, "bench %s: %s (%d process(es))\n", bench, tag, procs)
	if err := launch.Run(context.Background(), launch.Options{NProc: procs, Stdout: io.Discard, Stderr: stderr}, argv); err != nil {
		return fmt.Errorf("bench %s %s: %w", bench, tag, err)
	}
	return nil
}

// metricLine is one line of a metrics file with the fields the benchmarks
// read: a "train" line's step figures or a "memory" line's rank report.
type metricLine struct {
	Kind   string  `json:"kind"`
	Step   int     `json:"step"`
	Loss   float64 `json:"loss"`
	StepMS float64 `json:"step_ms"`
	TPS    float64 `json:"tokens_per_s"`
	Comm   float64 `json:"comm_bytes"`
	Rank   int     `json:"rank"`
	Params float64 `json:"params_bytes"`
	Grads  float64 `json:"grads_bytes"`
	Optim  float64 `json:"optim_bytes"`
	Act    float64 `json:"activations_peak_bytes"`
	Peak   float64 `json:"peak_bytes"`
	RSS    float64 `json:"rss_peak_bytes"`
	// A MoE run's routing (train lines): tokens per expert and, under
	// expert parallel, the rows rank 0 exchanged with other ranks.
	ExpertLoad [][]float64 `json:"expert_load"`
	ExpertRows float64     `json:"expert_rows"`
}

// readMetrics reads every line of a metrics file (metrics_file).
func readMetrics(path string) ([]metricLine, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []metricLine
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m metricLine
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, m)
	}
	return out, sc.Err()
}
