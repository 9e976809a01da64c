package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/data"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins"
)

// benchCkpt measures checkpoints of the whole training state under ZeRO-3
// on N goroutine ranks: seconds to save and to resume (load into fresh
// trainers of the same layout), bytes on disk against the formula 4Ψ
// (float32 weights) + 8Ψ (AdamW's two moments), and the most a save and a
// load added to any rank's memory at once (the allocator's window peak)
// against the model's size 4Ψ. Each model trains one step first so the
// optimizer state exists. (Writing also uses a fixed 2 MiB encoding buffer
// per file, outside the allocator.)
func benchCkpt(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench ckpt", flag.ContinueOnError)
	n := fs.Int("nproc", 4, "data-parallel ranks (goroutines of this process)")
	stage := fs.Int("zero", 3, "ZeRO stage")
	models := fs.String("models", "demo,85m", "models: demo (4 layers, 128 wide, context 128, the default model), 85m (12 layers, 768 wide, vocabulary 256)")
	dir := fs.String("dir", "", "where to write the checkpoints (default: a temporary directory, removed after)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	root, _, done, err := benchFiles(*dir, "ckpt")
	if err != nil {
		return err
	}
	defer done()
	fmt.Fprintf(stdout, "checkpoints of the whole training state, ZeRO-%d on %d ranks (goroutines of one process)\n", *stage, *n)
	if strings.Contains(","+*models+",", ",85m,") {
		// A run with the 85m model peaks near 12 GB of resident memory
		// (measured on the whole benchmark); say so before it starts.
		fmt.Fprintln(stdout, "note: the 85m model needs about 12 GB of memory; --models demo needs far less")
	}
	fmt.Fprintf(stdout, "%-6s %10s %8s %8s %12s %12s %7s %14s %9s\n", "model", "params", "save s", "resume s", "disk bytes", "12Ψ bytes", "ratio", "save peak/rank", "vs 4Ψ")
	for _, name := range strings.Split(*models, ",") {
		cfg := config.Defaults()
		switch name {
		case "demo":
			cfg.Model.NLayer, cfg.Model.NHead, cfg.Model.NEmbd, cfg.Model.BlockSize = 4, 4, 128, 128
		case "85m":
			cfg.Model.NLayer, cfg.Model.NHead, cfg.Model.NEmbd, cfg.Model.BlockSize = 12, 12, 768, 128
		default:
			return fmt.Errorf("bench ckpt: unknown model %q (have demo, 85m)", name)
		}
		cfg.Model.VocabSize = 256
		cfg.Train.Steps, cfg.Train.BatchSize, cfg.Train.EvalEvery = 1, 1, 0
		cfg.Data.ValFraction = 0
		cfg.Zero.Stage = *stage
		r, err := ckptRun(cfg, *n, filepath.Join(root, name))
		if err != nil {
			return fmt.Errorf("bench ckpt %s: %w", name, err)
		}
		psi := trainer.GPTConfig(cfg).NumParams()
		fmt.Fprintf(stdout, "%-6s %9.1fM %8.2f %8.2f %12d %12d %7.3f %11.1f MiB %8.1f%%\n", name, float64(psi)/1e6,
			r.save.Seconds(), r.load.Seconds(), r.bytes, 12*psi, float64(r.bytes)/float64(12*psi),
			float64(r.savePeak)/(1<<20), 100*float64(r.savePeak)/float64(4*psi))
		fmt.Fprintf(stdout, "%-6s load peak/rank %.1f MiB (%.1f%% of 4Ψ)\n", "", float64(r.loadPeak)/(1<<20), 100*float64(r.loadPeak)/float64(4*psi))
	}
	return nil
}

type ckptResult struct {
	save, load         time.Duration
	bytes              int64
	savePeak, loadPeak int64
}

// ckptRun trains one step on n ranks, saves, then resumes in fresh
// trainers, timing both from the slowest rank's view.
func ckptRun(cfg config.Config, n int, dir string) (ckptResult, error) {
	var res ckptResult
	tokens := data.Encode(strings.Repeat("func main() { fmt.Println(\"checkpoint\") }\n", 400))
	var mu sync.Mutex
	saveStart, loadStart := make([]time.Time, n), make([]time.Time, n)
	err := comm.RunLocal(n, comm.Options{Timeout: cfg.Comm.Timeout}, func(g comm.Group) error {
		ps, m, err := plugins.Build(cfg, g)
		if err != nil {
			return err
		}
		tr, err := trainer.New(cfg, trainer.Options{Train: tokens, Plugins: ps, Mesh: m, Rank: g.Rank(), World: n})
		if err != nil {
			return err
		}
		if _, err := tr.Step(0); err != nil {
			return err
		}
		if err := g.Barrier(); err != nil {
			return err
		}
		saveStart[g.Rank()] = time.Now()
		if _, err := tr.SaveCheckpoint(dir, 1); err != nil {
			return err
		}
		saved := time.Since(saveStart[g.Rank()])
		// A fresh trainer of the same layout resumes.
		ps, m, err = plugins.Build(cfg, g)
		if err != nil {
			return err
		}
		fresh, err := trainer.New(cfg, trainer.Options{Train: tokens, Plugins: ps, Mesh: m, Rank: g.Rank(), World: n})
		if err != nil {
			return err
		}
		if err := g.Barrier(); err != nil {
			return err
		}
		loadStart[g.Rank()] = time.Now()
		if _, err := fresh.LoadCheckpoint(filepath.Join(dir, ckpt.StepDir(1))); err != nil {
			return err
		}
		loaded := time.Since(loadStart[g.Rank()])
		mu.Lock()
		res.save, res.load = max(res.save, saved), max(res.load, loaded)
		res.savePeak = max(res.savePeak, tr.Memory().SavePeakBytes)
		res.loadPeak = max(res.loadPeak, fresh.Memory().LoadPeakBytes)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return res, err
	}
	// Everything on disk: the ranks' files and the index.
	entries, err := os.ReadDir(filepath.Join(dir, ckpt.StepDir(1)))
	if err != nil {
		return res, err
	}
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			return res, err
		}
		res.bytes += info.Size()
	}
	return res, nil
}
