package plugins

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/cp"
	"github.com/tinyacc/tinyacc/plugins/ddp"
	"github.com/tinyacc/tinyacc/plugins/ep"
	"github.com/tinyacc/tinyacc/plugins/pp"
	"github.com/tinyacc/tinyacc/plugins/process"
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
// parallel form); parallel.cp > 1 context parallel over the CP group
// (cp.attention, cp.split), whose gradients plain DDP averages over
// DP × CP. zero.stage 0 picks
// DDP (ddp.mode naive or bucketed), 1 to 3 the ZeRO stage, both over the
// data-parallel group. A single process gets no mesh and no plugins but
// the process plugins. parallel.ep > 1 adds expert parallel (plugins/ep)
// before data parallel, which then averages only the parameters every dp
// rank holds. The binaries of plugins.process are started here
// (see package process): one that serves ddp takes DDP's place, the others
// come last, in their order; ddp.process: true starts DDP itself as a
// plugin process. Close the returned plugins with process.CloseAll.
func Build(cfg config.Config, world comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) {
	if world == nil || world.Size() == 1 {
		ext, err := process.StartAll(cfg, nil, 0)
		return asPlugins(ext), nil, err
	}
	out, m, err := build(cfg, world)
	if err != nil {
		return nil, nil, err
	}
	ext, err := process.StartAll(cfg, m.DP(), world.Rank())
	if err != nil {
		process.CloseAll(out)
		return nil, nil, err
	}
	return placeProcesses(out, ext), m, nil
}

// build is Build's mesh and compiled plugins (with DDP as a process when
// ddp.process is true).
func build(cfg config.Config, world comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) {
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
	// Model rewriters first: tensor parallel, then context parallel;
	// then the step owner (pipeline parallel).
	if p.TP > 1 {
		t, err := tp.New(m, cfg.TP.SequenceParallel)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, t)
	}
	if p.CP > 1 {
		c, err := cp.New(m, cfg.CP.Attention, cfg.CP.Split, !ddpOverDPCP(cfg))
		if err != nil {
			return nil, nil, err
		}
		out = append(out, c)
	}
	if p.PP > 1 {
		o, err := pp.New(cfg, m)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, o)
	}
	var experts *ep.EP
	if p.EP > 1 {
		e, err := ep.New(m, p.EP, cfg.EP.Dispatch, cfg.DDP.Mode)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, e)
		experts = e
	}
	if dp > 1 || (p.CP > 1 && ddpOverDPCP(cfg)) {
		d, err := dataParallel(cfg, m)
		if err != nil {
			return nil, nil, err
		}
		if z, ok := d.(*zero.Zero); ok && experts != nil {
			// ZeRO shards the experts over their replicas, as the other
			// parameters over dp, and reduces their gradients itself.
			z.Held, z.HeldScale = experts.HandOver()
		}
		out = append(out, d)
	}
	return out, m, nil
}

// dataParallel is the data-parallel plugin of cfg over m's dp group.
func dataParallel(cfg config.Config, m *mesh.Mesh) (trainer.Plugin, error) {
	if cfg.Zero.Stage > 0 {
		z, err := zero.New(m.DP(), cfg.Zero.Stage)
		if err != nil {
			return nil, err
		}
		z.Reduce = ddp.ReduceDType(cfg)
		return z, nil
	}
	if cfg.DDP.Process {
		return process.NewDDP(m.DP(), m.Rank())
	}
	if cfg.Parallel.CP > 1 {
		d, err := ddp.FromConfig(m.DPCP(), cfg)
		if err != nil {
			return nil, err
		}
		d.Data = m.DP()
		return d, nil
	}
	return ddp.FromConfig(m.DP(), cfg)
}

// ddpOverDPCP reports whether data parallel is plain DDP, which averages
// gradients over the DP × CP group at once (a CP rank's loss is the mean
// over its equal share of the sequences' tokens, so the DP × CP mean of
// the ranks' gradients is the gradient of the global batch's mean loss).
// ZeRO and DDP as a plugin process reduce over the DP group only; context
// parallel then averages over CP itself first.
func ddpOverDPCP(cfg config.Config) bool {
	return cfg.Zero.Stage == 0 && !cfg.DDP.Process
}
