package main

import (
	"fmt"
	"io"
	"runtime"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins"
)

// cmdEstimate prints the per-rank memory estimate of the run train would
// start with the same arguments, without starting ranks or allocating the
// model. --json writes one JSON object per rank on stdout and nothing else.
func cmdEstimate(args []string, stdout, stderr io.Writer) error {
	asJSON := false
	var rest []string
	for _, a := range args {
		if a == "--json" {
			asJSON = true
			continue
		}
		rest = append(rest, a)
	}
	nproc, localRanks, rest, err := splitRankFlags(rest)
	if err != nil {
		return err
	}
	r, err := loadConfig(rest)
	if err != nil {
		return err
	}
	world := max(nproc, localRanks, 1)
	es, err := plugins.EstimateProcesses(r.Config, world, nproc)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSONLines(stdout, es)
	}
	trainer.WriteEstimateTable(stdout, es)
	if extra := trainer.RecomputeFLOPsPerToken(r.Config); extra > 0 {
		base := trainer.GPTConfig(r.Config).FLOPsPerToken()
		fmt.Fprintf(stdout, "recompute.granularity=full: %d blocks run their forward again, %.3g FLOPs per token on top of %.3g (+%.0f%% compute)\n",
			trainer.RecomputedBlocks(r.Config, r.Config.Model.NLayer), extra, base, 100*extra/base)
	}
	limit, source, err := memoryLimit(r.Config)
	if err != nil {
		return err
	}
	if limit > 0 {
		fmt.Fprintf(stdout, "memory.limit=%s: %.1f MiB per rank on this host (%d local ranks)\n", source, float64(limit)/(1<<20)/float64(world), world)
	} else {
		fmt.Fprintln(stdout, "memory.limit=0: no check")
	}
	return plugins.CheckMemory(r.Config, world, nproc, es, limit, world, source)
}

// memoryLimit is memory.limit in bytes (0: no check) and how it was found.
func memoryLimit(cfg config.Config) (int64, string, error) {
	n, err := config.ParseMemoryLimit(cfg.Memory.Limit)
	if err != nil {
		return 0, "", err
	}
	if n < 0 {
		n, src := trainer.HostMemoryLimit()
		return n, src, nil
	}
	return n, cfg.Memory.Limit, nil
}

// checkBeforeWork is what train does before it allocates or spawns
// anything: the layout against the world, the memory estimate against
// memory.limit (the local ranks share the host's limit), and a warning
// when more processes than cores are asked for.
func checkBeforeWork(cfg config.Config, world, local, nproc int, stderr io.Writer) error {
	es, err := plugins.EstimateProcesses(cfg, world, nproc)
	if err != nil {
		return err
	}
	limit, source, err := memoryLimit(cfg)
	if err != nil {
		return err
	}
	if err := plugins.CheckMemory(cfg, world, nproc, es, limit, local, source); err != nil {
		return err
	}
	if n := runtime.NumCPU(); nproc > n {
		fmt.Fprintf(stderr, "tinyacc: warning: --nproc %d starts more processes than the %d cores of this machine; they will share them and run slower\n", nproc, n)
	}
	return nil
}

// limitHeap bounds this process's Go heap to the estimate of the ranks it
// runs (trainer.LimitHeap): rank of a job of world ranks, or all of them
// (rank -1, goroutine ranks). A config the estimate refuses is left to the
// ranks, which refuse it with their own message.
func limitHeap(cfg config.Config, world, rank int) {
	es, err := plugins.Estimate(cfg, world)
	if err != nil {
		return
	}
	if rank >= 0 && rank < len(es) {
		es = es[rank : rank+1]
	}
	trainer.LimitHeap(es)
}
