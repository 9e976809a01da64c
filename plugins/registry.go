package plugins

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ddp"
	"github.com/tinyacc/tinyacc/plugins/tp"
	"github.com/tinyacc/tinyacc/plugins/zero"
)

// Build lays the world out as the mesh of cfg (pp outermost, then dp, cp,
// and tp innermost; see core/mesh) and returns this rank's plugins, in
// the one order the trainer runs them (see trainer.Plugin for what the
// order decides): model rewriters first
// (tensor parallel, then context parallel), then the step owner (pipeline
// parallel), then data parallel (DDP or ZeRO). parallel.dp = 0 gives data
// parallelism every rank the other dimensions leave. parallel.tp > 1 adds
// tensor parallel over the TP group (tp.sequence_parallel for its sequence
// parallel form). zero.stage 0 picks
// DDP (ddp.mode naive or bucketed), 1 to 3 the ZeRO stage, both over the
// data-parallel group. A single process gets no mesh and no plugins.
func Build(cfg config.Config, world comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) {
	if world == nil || world.Size() == 1 {
		return nil, nil, nil
	}
	p := cfg.Parallel
	dp := p.DP
	if dp == 0 {
		other := p.TP * p.CP * p.PP
		if other > world.Size() {
			return nil, nil, fmt.Errorf("plugins: tp %d × cp %d × pp %d needs at least %d ranks; the world has %d", p.TP, p.CP, p.PP, other, world.Size())
		}
		if world.Size()%other != 0 {
			return nil, nil, fmt.Errorf("plugins: world size %d is not a multiple of tp %d × cp %d × pp %d", world.Size(), p.TP, p.CP, p.PP)
		}
		dp = world.Size() / other
	}
	m, err := mesh.New(world, p.TP, p.CP, dp, p.PP)
	if err != nil {
		return nil, nil, err
	}
	var out []trainer.Plugin
	// Model rewriters first: tensor parallel (context parallel to come),
	// then the step owner (pipeline parallel, to come).
	if p.TP > 1 {
		t, err := tp.New(m, cfg.TP.SequenceParallel)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, t)
	}
	if dp > 1 {
		d, err := dataParallel(cfg, m)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, d)
	}
	return out, m, nil
}

// dataParallel is the data-parallel plugin of cfg over m's dp group.
func dataParallel(cfg config.Config, m *mesh.Mesh) (trainer.Plugin, error) {
	if cfg.Zero.Stage > 0 {
		return zero.New(m.DP(), cfg.Zero.Stage)
	}
	return ddp.New(m.DP(), cfg.DDP.Mode, cfg.DDP.BucketMB, cfg.DDP.FirstBucketMB)
}
