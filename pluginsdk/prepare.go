package pluginsdk

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// prepare maps the arena, builds the mirror trainer, joins the plugin
// group when asked, makes the plugin and runs its Prepare with the
// allocator drawing from the arena, and reports where the gradients lie.
func (s *server) prepare(req *PrepareReq) (*PrepareResp, error) {
	if s.p != nil {
		return nil, fmt.Errorf("Prepare twice")
	}
	a, err := OpenArena(req.Arena, req.ArenaBytes)
	if err != nil {
		return nil, err
	}
	s.arena = a
	cfg := req.Config
	alloc := tensor.NewAllocator()
	// The mirror's parameters are views of the host's arena: described
	// only, never built.
	model, err := nn.Describe(trainer.GPTConfig(cfg), trainer.DTypeOf(cfg), alloc)
	if err != nil {
		return nil, fmt.Errorf("building the model mirror: %w", err)
	}
	params := model.Params()
	if len(params) != len(req.Params) {
		return nil, fmt.Errorf("the host's model has %d parameters, the config's %d: a plugin process needs the model of the config", len(req.Params), len(params))
	}
	for i, p := range params {
		hp := req.Params[i]
		if p.Name != hp.Name || !slices.Equal(p.Shape(), hp.Shape) || p.DType() != tensor.Float32 {
			return nil, fmt.Errorf("parameter %d is %s %v here and %s %v in the host", i, p.Name, p.Shape(), hp.Name, hp.Shape)
		}
		value, err := a.F32(hp.Value, p.Shape()...)
		if err != nil {
			return nil, fmt.Errorf("value of %s: %w", p.Name, err)
		}
		p.Alias(value, 0)
		if p.Grad, err = a.F32(hp.Grad, p.Shape()...); err != nil {
			return nil, fmt.Errorf("gradient of %s: %w", p.Name, err)
		}
		p.Grad.Name = p.Name
	}
	alloc.DropPool()
	t := &trainer.Trainer{Cfg: cfg, Model: model, Alloc: alloc, Rank: req.Rank, World: req.World, DataSize: 1}
	env := &Env{Trainer: t, Log: s.log}
	if s.info.Comm {
		if req.Comm == nil {
			return nil, fmt.Errorf("plugin %s asks for a group, but the host sent no rendezvous", s.info.Name)
		}
		if env.Group, err = joinGroup(req.Comm, cfg.Comm.Timeout); err != nil {
			return nil, err
		}
	}
	p, err := s.newPlugin(env)
	if err != nil {
		return nil, err
	}
	if err := checkUnsupported(p); err != nil {
		return nil, err
	}
	s.env, s.params = env, params
	if pr, ok := p.(trainer.Preparer); ok {
		b := &bump{a: a, off: (req.Used + 63) &^ 63}
		alloc.SetBacking(b.alloc)
		err := pr.Prepare(t)
		alloc.SetBacking(nil)
		if err == nil {
			err = b.err
		}
		if err != nil {
			return nil, err
		}
	}
	resp := &PrepareResp{Hooks: hooksOf(p)}
	if t.DataSize != 1 || t.DataRank != 0 {
		resp.DataRank, resp.DataSize = t.DataRank, t.DataSize
	}
	for i, q := range params {
		if off, ok := a.Offset(q); !ok || off != req.Params[i].Value {
			return nil, fmt.Errorf("plugin %s moved the value of %s out of its place in the arena; a plugin that re-lays parameters must stay compiled", s.info.Name, q.Name)
		}
		off, ok := a.Offset(q.Grad)
		if !ok {
			return nil, fmt.Errorf("plugin %s put the gradient of %s outside the arena (allocate it from Trainer.Alloc during Prepare)", s.info.Name, q.Name)
		}
		resp.Grads = append(resp.Grads, off)
	}
	s.p = p
	return resp, nil
}

// joinGroup joins the tcp group of the plugin processes of the
// data-parallel ranks. The variables are this process's own: the host's
// RANK and WORLD_SIZE, inherited, describe the host's job, not this group.
func joinGroup(c *CommInfo, timeout time.Duration) (comm.Group, error) {
	for k, v := range map[string]string{
		"RANK": strconv.Itoa(c.Rank), "WORLD_SIZE": strconv.Itoa(c.Size),
		"LOCAL_RANK": strconv.Itoa(c.Rank), "LOCAL_WORLD_SIZE": strconv.Itoa(c.Size),
		"MASTER_ADDR": c.Addr, "MASTER_PORT": strconv.Itoa(c.Port), "TINYACC_JOB_TOKEN": c.Token,
	} {
		os.Setenv(k, v)
	}
	g, err := comm.InitFromEnv(comm.Options{Backend: "tcp", Timeout: timeout})
	if err != nil {
		return nil, fmt.Errorf("joining the plugin group (rank %d of %d at %s:%d): %w", c.Rank, c.Size, c.Addr, c.Port, err)
	}
	return g, nil
}
