package plugins

import (
	"testing"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// TestPipelineTensorParallel composes pipeline stages with tensor parallel
// inside each stage (and data parallel around both), against one process
// on the same global batch: pp 2 × tp 2 on 4 goroutine ranks under each
// schedule, with and without sequence parallel, and pp 2 × tp 2 × dp 2 on
// 8 ranks with bucketed DDP and ZeRO-1. The tied embedding then lives on
// two pipeline stages, each split over its TP group: its gradient is summed
// across the stages shard by shard. A tcp row runs pp 2 × tp 2.
func TestPipelineTensorParallel(t *testing.T) {
	rows := []struct {
		name     string
		dp       int
		backend  string
		schedule string
		sp       bool
		apply    func(c *config.Config)
	}{
		{"pp2 tp2 1f1b", 1, "local", "1f1b", false, nil},
		{"pp2 tp2 sp afab", 1, "local", "afab", true, nil},
		{"pp2 tp2 interleaved", 1, "local", "interleaved", false, func(c *config.Config) { c.PP.VirtualStages = 2 }},
		{"pp2 tp2 sp zb1", 1, "local", "zb1", true, nil},
		{"pp2 tp2 dp2 ddp bucketed 1f1b", 2, "local", "1f1b", false, func(c *config.Config) {
			c.DDP.Mode, c.DDP.BucketMB, c.DDP.FirstBucketMB = "bucketed", 0.02, 0.01
		}},
		{"pp2 tp2 sp dp2 zero1 zb1", 2, "local", "zb1", true, func(c *config.Config) { c.Zero.Stage = 1 }},
		{"pp2 tp2 tcp 1f1b", 1, "tcp", "1f1b", true, nil},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			cfg := tpConfig(2, r.sp, 2)
			cfg.Model.NLayer = 4
			cfg.Train.Steps = 3
			cfg.Parallel.PP, cfg.PP.Schedule = 2, r.schedule
			if r.apply != nil {
				r.apply(&cfg)
			}
			single := tpConfig(1, false, 2)
			single.Model.NLayer = 4
			single.Train.Steps = 3
			single.Train.BatchSize *= r.dp
			want := ptest.Single(t, single)
			got := ptest.Parallel(t, cfg, 4*r.dp, r.backend, buildFrom(cfg))
			ptest.Check(t, want, got, r.name)
		})
	}
}
