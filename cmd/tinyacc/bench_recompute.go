package main

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins"
)

// benchRecompute trains one process at GPT-2 small's shape (12 blocks, 768
// wide, context 256, the byte vocabulary) and at the demo shape (the
// defaults) under each activation recomputation granularity, and prints
// ms/step and the activation peak (the allocator's, and the estimate's)
// beside none's. Several rounds over the rows keep a busy machine's noise
// from landing on one row.
func benchRecompute(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench recompute", flag.ContinueOnError)
	fs.SetOutput(stderr)
	steps := fs.Int("steps", 2, "timed steps per row and round (after one untimed)")
	rounds := fs.Int("rounds", 2, "rounds over the rows")
	batch := fs.String("batch", "1,8", "batch size at GPT-2 small's shape and at the demo shape")
	shapes := fs.String("shapes", "gpt2,demo", "shapes to run: gpt2, demo")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var batches []int
	for _, f := range strings.Split(*batch, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("bench recompute: --batch %q: want two positive sizes like 1,8", *batch)
		}
		batches = append(batches, n)
	}
	if len(batches) != 2 || *steps < 1 || *rounds < 1 {
		return fmt.Errorf("bench recompute: --batch takes two sizes (GPT-2 small, demo), --steps and --rounds positive counts")
	}
	type shape struct {
		name   string
		cfg    config.Config
		layers int
	}
	var runs []shape
	for _, s := range strings.Split(*shapes, ",") {
		c := config.Defaults()
		switch strings.TrimSpace(s) {
		case "gpt2":
			c.Model.NLayer, c.Model.NHead, c.Model.NEmbd, c.Model.BlockSize = 12, 12, 768, 256
			c.Train.BatchSize = batches[0]
		case "demo":
			c.Train.BatchSize = batches[1]
		default:
			return fmt.Errorf("bench recompute: --shapes %q: want gpt2, demo or both", *shapes)
		}
		c.Train.Steps, c.Train.EvalEvery, c.Data.ValFraction, c.Memory.Limit = 1+*steps, 0, 0, "0"
		c.Train.Schedule, c.Data.Order = "constant", "random"
		runs = append(runs, shape{strings.TrimSpace(s), c, c.Model.NLayer})
	}
	fmt.Fprintf(stdout, "%-6s %-22s %10s %9s %14s %14s %8s %10s\n", "shape", "recompute", "ms/step", "vs none", "act MiB meas", "act MiB est", "est err", "vs none")
	for _, s := range runs {
		m := s.cfg.Model
		fmt.Fprintf(stderr, "bench recompute: %s: GPT n_layer %d n_embd %d block %d vocab %d batch %d, %d rounds of %d timed steps per row\n",
			s.name, m.NLayer, m.NEmbd, m.BlockSize, m.VocabSize, s.cfg.Train.BatchSize, *rounds, *steps)
		type row struct {
			name   string
			gran   string
			blocks int
			times  []float64
			act    int64
		}
		rows := []*row{{name: "none", gran: "none"}, {name: "selective", gran: "selective"}, {name: "full", gran: "full"},
			{name: fmt.Sprintf("full blocks=%d", s.layers/2), gran: "full", blocks: s.layers / 2}}
		// Rounds visit every row in turn, so a busy machine slows them
		// alike; each row's figure is the median of all its timed steps.
		for range *rounds {
			for _, r := range rows {
				cfg := s.cfg
				cfg.Recompute.Granularity, cfg.Recompute.Blocks = r.gran, r.blocks
				times, act, err := recomputeStep(cfg, *steps)
				if err != nil {
					return fmt.Errorf("bench recompute: %s %s: %w", s.name, r.name, err)
				}
				r.times, r.act = append(r.times, times...), act
			}
		}
		noneMS, noneAct := median(rows[0].times), rows[0].act
		for _, r := range rows {
			cfg := s.cfg
			cfg.Recompute.Granularity, cfg.Recompute.Blocks = r.gran, r.blocks
			est, err := plugins.Estimate(cfg, 1)
			if err != nil {
				return err
			}
			ms := median(r.times)
			mib := func(b int64) float64 { return float64(b) / (1 << 20) }
			fmt.Fprintf(stdout, "%-6s %-22s %10.1f %8.2fx %14.1f %14.1f %+7.1f%% %9.2fx\n", s.name, r.name, ms, ms/noneMS,
				mib(r.act), mib(est[0].ActPeak), 100*float64(est[0].ActPeak-r.act)/float64(r.act), float64(r.act)/float64(noneAct))
		}
	}
	return nil
}

// recomputeStep trains cfg in this process on random tokens and returns
// the ms of each step after the first and the activation peak.
func recomputeStep(cfg config.Config, steps int) ([]float64, int64, error) {
	r := nn.NewRand(1, "bench-tokens")
	tokens := make([]int32, 1<<20)
	for i := range tokens {
		tokens[i] = int32(r.Uint64() % uint64(cfg.Model.VocabSize))
	}
	t, err := trainer.New(cfg, trainer.Options{Train: tokens})
	if err != nil {
		return nil, 0, err
	}
	var times []float64
	for i := 0; i <= steps; i++ {
		start := time.Now()
		if _, err := t.Step(i); err != nil {
			return nil, 0, err
		}
		if i > 0 {
			times = append(times, float64(time.Since(start).Microseconds())/1000)
		}
	}
	return times, t.Alloc.Usage().Peak[tensor.Activations], nil
}
