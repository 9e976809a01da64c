package plugins

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ddp"
	"github.com/tinyacc/tinyacc/plugins/zero"
)

// Build returns the plugins cfg selects for this rank of world (none for a
// single process). The world is arranged as the dp × pp × cp × tp mesh;
// parallel.dp = 0 gives data parallelism every rank the other dimensions
// leave. zero.stage 0 picks DDP (ddp.mode naive or bucketed), 1 to 3 the
// ZeRO stage, both over the data-parallel group.
func Build(cfg config.Config, world comm.Group) ([]trainer.Plugin, error) {
	if world == nil || world.Size() == 1 {
		return nil, nil
	}
	p := cfg.Parallel
	dp := p.DP
	if dp == 0 {
		other := p.TP * p.CP * p.PP
		if world.Size()%other != 0 {
			return nil, fmt.Errorf("plugins: world size %d is not a multiple of tp %d × cp %d × pp %d", world.Size(), p.TP, p.CP, p.PP)
		}
		dp = world.Size() / other
	}
	m, err := mesh.New(world, p.TP, p.CP, dp, p.PP)
	if err != nil {
		return nil, err
	}
	if dp == 1 {
		return nil, nil
	}
	if cfg.Zero.Stage > 0 {
		z, err := zero.New(m.DP(), cfg.Zero.Stage)
		if err != nil {
			return nil, err
		}
		return []trainer.Plugin{z}, nil
	}
	d, err := ddp.New(m.DP(), cfg.DDP.Mode, cfg.DDP.BucketMB, cfg.DDP.FirstBucketMB)
	if err != nil {
		return nil, err
	}
	return []trainer.Plugin{d}, nil
}
