package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins"
)

// benchLoRA saves a base of GPT-2 small's shape (12 blocks, 768 wide,
// GPT-2's vocabulary) from a one-step run, then fine-tunes it on 2
// goroutine ranks under ZeRO-2 in full and with LoRA adapters of rank 8
// on c_attn, and prints side by side per rank: ms/step, gradient and
// optimizer bytes (the allocator's peaks) and bytes sent per step, with
// LoRA's share of full fine-tuning's.
func benchLoRA(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench lora", flag.ContinueOnError)
	fs.SetOutput(stderr)
	steps := fs.Int("steps", 2, "timed steps per row (after one untimed)")
	block := fs.Int("block_size", 64, "context length")
	layers := fs.Int("n_layer", 12, "blocks")
	width := fs.Int("n_embd", 768, "width")
	rank := fs.Int("rank", 8, "LoRA rank")
	zero := fs.Int("zero", 2, "ZeRO stage of both rows (0: DDP)")
	keep := fs.String("dir", "", "where the base weights go (default: a temporary directory)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *steps < 1 || *block < 1 || *layers < 1 || *width < 12 || *width%12 != 0 || *rank < 1 {
		return fmt.Errorf("bench lora: --steps, --block_size, --n_layer and --rank must be positive and --n_embd a multiple of 12")
	}
	dir := *keep
	if dir == "" {
		d, err := os.MkdirTemp("", "tinyacc-bench-lora-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	c := config.Defaults()
	c.Model.NLayer, c.Model.NHead, c.Model.NEmbd, c.Model.BlockSize, c.Model.VocabSize = *layers, 12, *width, *block, 50257
	c.Train.BatchSize, c.Train.Steps, c.Train.EvalEvery, c.Data.ValFraction, c.Memory.Limit = 1, 1+*steps, 0, 0, "0"
	c.Train.Schedule, c.Data.Order, c.Data.Format = "constant", "random", "tokens"
	c.Zero.Stage, c.Parallel.DP, c.Comm.Backend = *zero, 2, "local"
	r := nn.NewRand(1, "bench-tokens")
	tokens := make([]int32, 1<<18)
	for i := range tokens {
		tokens[i] = int32(r.Uint64() % uint64(c.Model.VocabSize))
	}

	base := filepath.Join(dir, "base.safetensors")
	fmt.Fprintf(stderr, "bench lora: saving a base of n_layer %d n_embd %d vocab %d from a one-step run to %s\n", *layers, *width, c.Model.VocabSize, base)
	b := c
	b.Train.Steps, b.Parallel.DP, b.Zero.Stage = 1, 1, 0
	t, err := trainer.New(b, trainer.Options{Train: tokens})
	if err != nil {
		return err
	}
	if _, err := t.Step(0); err != nil {
		return err
	}
	if err := t.SaveModel(base); err != nil {
		return err
	}
	t = nil

	type row struct {
		name        string
		ms          float64
		gradOptim   int64
		sent        int64
		trainedElem int64
	}
	var rows []row
	for _, lora := range []bool{false, true} {
		cfg := c
		cfg.InitFrom = base
		name := "full"
		if lora {
			cfg.LoRA.Rank, cfg.LoRA.Targets = *rank, []string{"c_attn"}
			name = fmt.Sprintf("lora r%d c_attn", *rank)
		}
		fmt.Fprintf(stderr, "bench lora: %s, 2 ranks, zero.stage %d, %d timed steps\n", name, *zero, *steps)
		var mu sync.Mutex
		var times []float64
		var sent, gradOptim int64
		err := comm.RunLocal(2, comm.Options{Timeout: cfg.Comm.Timeout}, func(g comm.Group) error {
			ps, m, err := plugins.Build(cfg, g)
			if err != nil {
				return err
			}
			tr, err := trainer.New(cfg, trainer.Options{Train: tokens, Plugins: ps, Mesh: m, Rank: g.Rank(), World: 2})
			if err != nil {
				return err
			}
			var mine []float64
			var bytes int64
			for i := 0; i <= *steps; i++ {
				sm, err := tr.Step(i)
				if err != nil {
					return err
				}
				if i > 0 {
					mine, bytes = append(mine, sm.StepMS), bytes+sm.CommBytes
				}
			}
			mem := tr.Memory()
			if g.Rank() == 0 {
				mu.Lock()
				times, sent, gradOptim = mine, bytes/int64(*steps), mem.GradsBytes+mem.OptimBytes
				mu.Unlock()
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("bench lora: %s: %w", name, err)
		}
		m := trainer.GPTConfig(cfg)
		rows = append(rows, row{name, median(times), gradOptim, sent, trainer.Numel(m.TrainedShapes())})
	}
	full := rows[0]
	fmt.Fprintf(stdout, "%-16s %12s %10s %18s %9s %16s %9s\n", "fine-tuning", "trained", "ms/step", "grad+optim B/rank", "vs full", "sent B/step/rank", "vs full")
	for _, r := range rows {
		fmt.Fprintf(stdout, "%-16s %12d %10.1f %18d %8.3f%% %16d %8.3f%%\n", r.name, r.trainedElem, r.ms, r.gradOptim,
			100*float64(r.gradOptim)/float64(full.gradOptim), r.sent, 100*float64(r.sent)/float64(full.sent))
	}
	return nil
}
