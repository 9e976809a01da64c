package plugins

import (
	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/cp"
	"github.com/tinyacc/tinyacc/plugins/ep"
	"github.com/tinyacc/tinyacc/plugins/pp"
	"github.com/tinyacc/tinyacc/plugins/tp"
	"github.com/tinyacc/tinyacc/plugins/zero"
)

// EstimateProcesses is Estimate of a run of world ranks, nproc of them
// processes of this host (train --nproc; 0 for goroutine ranks or one
// process): on the tcp backend each of those also maps the shared-memory
// rings to the other nproc-1 (comm.RingBytes), its SharedBytes, the same
// in every layout of those processes. Train's memory check, the layouts
// it names and the planner all count a process's need from here.
func EstimateProcesses(cfg config.Config, world, nproc int) ([]trainer.MemoryEstimate, error) {
	es, err := Estimate(cfg, world)
	if err != nil || nproc < 2 || cfg.Comm.Backend != "tcp" {
		return es, err
	}
	// The rings are sized by the transport's chunk, which no config key
	// changes.
	shared := comm.RingBytes(nproc-1, comm.Options{Backend: cfg.Comm.Backend})
	for i := range es {
		es[i].SharedBytes = shared
	}
	return es, nil
}

// Estimate predicts every rank's memory for a run of cfg on world ranks,
// before any rank starts: it checks the layout as Build would lay it out
// (parallel.* against the world), then asks the estimators of the plugins
// Build would make, in the same order, for their terms (see
// trainer.MemoryEstimator). Nothing is allocated and no group is joined.
// A strategy added to Build adds its estimator here.
func Estimate(cfg config.Config, world int) ([]trainer.MemoryEstimate, error) {
	if err := cfg.CheckWorld(world); err != nil {
		return nil, err
	}
	p := cfg.Parallel
	dp := p.DP
	if dp == 0 {
		dp = world / max(1, p.TP*p.CP*p.PP)
	}
	var ests []trainer.MemoryEstimator
	// Model rewriters (tp, then cp), then the step owner (pp), then expert
	// parallel, in Build's order.
	if world > 1 && p.TP > 1 {
		ests = append(ests, tp.Estimator{N: p.TP})
	}
	if world > 1 && p.CP > 1 {
		c, err := cp.Estimator(cfg.CP.Attention, p.CP)
		if err != nil {
			return nil, err
		}
		ests = append(ests, c)
	}
	if world > 1 && p.PP > 1 {
		e, err := pp.NewEstimator(cfg, p.PP)
		if err != nil {
			return nil, err
		}
		ests = append(ests, e)
	}
	if world > 1 && p.EP > 1 {
		ests = append(ests, ep.Estimator{N: p.EP})
	}
	if world > 1 && dp > 1 && cfg.Zero.Stage > 0 {
		z, err := zero.Estimator(cfg.Zero.Stage)
		if err != nil {
			return nil, err
		}
		ests = append(ests, z)
	}
	// DDP (naive, bucketed or as a process) keeps full gradients in its
	// buckets, counted as gradients: one process's memory, no term.
	return trainer.EstimateMemory(cfg, world, dp, func(int) []trainer.MemoryEstimator { return ests })
}
