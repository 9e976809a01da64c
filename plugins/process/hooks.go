package process

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"slices"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/pluginsdk"
)

// prepared is what Prepare set up.
type prepared struct {
	params []*tensor.Tensor
	index  map[*tensor.Tensor]int
	hooks  []string
	grads  []*tensor.Tensor // the arena views installed as p.Grad
}

// Name implements trainer.Plugin.
func (p *Plugin) Name() string { return p.Info.Name }

// SetGroup gives a plugin that asks for a group (Info.Comm) the
// data-parallel group whose ranks' plugin processes it joins. Rank 0 of g
// picks the rendezvous and tells the others over g.
func (p *Plugin) SetGroup(g comm.Group) { p.group = g }

// Prepare lays the parameters and gradients out in a new arena (values,
// if any yet, copied in; the model's tensors become views of it), sends the plugin the
// layout, the config and a rendezvous, and adopts what the plugin's Prepare
// decided: where the gradients lie now and which data slice this rank reads.
func (p *Plugin) Prepare(t *trainer.Trainer) error {
	p.deadline = t.Cfg.Comm.Timeout
	params := t.Model.Params()
	var used int64
	req := pluginsdk.PrepareReq{Config: t.Cfg, Rank: t.Rank, World: t.World, HostPID: os.Getpid()}
	for _, q := range params {
		if q.DType() != tensor.Float32 {
			return fmt.Errorf("process plugin %s: parameter %s is %s, not float32", p.Info.Name, q.Name, q.DType())
		}
		req.Params = append(req.Params, pluginsdk.Param{Name: q.Name, Shape: q.Shape(), Value: used, Grad: used + q.Bytes(), DTypeFloat32: true})
		used += 2 * q.Bytes()
	}
	// Room for what the plugin allocates in Prepare (DDP's buckets: all
	// gradients once more), and some; unused pages cost nothing.
	size := 2*used + 16<<20
	a, err := pluginsdk.CreateArena(size, p.Info.Name)
	if err != nil {
		return fmt.Errorf("process plugin %s: %w", p.Info.Name, err)
	}
	p.arena = a
	req.Arena, req.ArenaBytes, req.Used = a.Path, size, used
	st := &prepared{params: params, index: map[*tensor.Tensor]int{}}
	for i, q := range params {
		st.index[q] = i
		value, err := a.F32(req.Params[i].Value, q.Shape()...)
		if err != nil {
			return err
		}
		if q.HasStorage() {
			value.CopyFrom(q)
		} // else a described parameter: the trainer fills it in the arena
		q.Alias(value, 0)
		g, err := a.F32(req.Params[i].Grad, q.Shape()...)
		if err != nil {
			return err
		}
		if q.Grad != nil {
			g.CopyFrom(q.Grad)
			q.Grad.Release()
		}
		g.Name = q.Name
		q.Grad = g
	}
	if p.Info.Comm {
		if req.Comm, err = p.rendezvous(); err != nil {
			return err
		}
	}
	var resp pluginsdk.PrepareResp
	err = p.call(pluginsdk.HookPrepare, &req, &resp)
	a.Remove() // mapped on both sides by now, or never will be
	if err != nil {
		return err
	}
	if len(resp.Grads) != len(params) {
		return fmt.Errorf("process plugin %s: Prepare placed %d gradients; the model has %d parameters", p.Info.Name, len(resp.Grads), len(params))
	}
	for i, q := range params {
		if resp.Grads[i] != req.Params[i].Grad {
			g, err := a.F32(resp.Grads[i], q.Shape()...)
			if err != nil {
				return fmt.Errorf("process plugin %s: gradient of %s: %w", p.Info.Name, q.Name, err)
			}
			g.Name = q.Name
			q.Grad = g
		}
		st.grads = append(st.grads, q.Grad)
	}
	if resp.DataSize > 0 {
		t.DataRank, t.DataSize = resp.DataRank, resp.DataSize
	}
	st.hooks = resp.Hooks
	p.state = st
	return nil
}

// rendezvous picks, on rank 0 of the group, a free port and a token for
// the plugin processes' own group, and shares them with the other ranks.
func (p *Plugin) rendezvous() (*pluginsdk.CommInfo, error) {
	g := p.group
	if g == nil {
		return nil, fmt.Errorf("process plugin %s asks for a group, but this rank is in no data-parallel group", p.Info.Name)
	}
	buf := tensor.FromI32(make([]int32, 5), 5) // port, then a 16-byte token
	if g.Rank() == 0 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("process plugin %s: picking a rendezvous port: %w", p.Info.Name, err)
		}
		buf.I32()[0] = int32(ln.Addr().(*net.TCPAddr).Port)
		ln.Close()
		var secret [16]byte
		if _, err := rand.Read(secret[:]); err != nil {
			return nil, err
		}
		for i := range 4 {
			buf.I32()[1+i] = int32(uint32(secret[4*i]) | uint32(secret[4*i+1])<<8 | uint32(secret[4*i+2])<<16 | uint32(secret[4*i+3])<<24)
		}
	}
	if err := g.Broadcast(buf, 0); err != nil {
		return nil, fmt.Errorf("process plugin %s: sharing the rendezvous of its group: %w", p.Info.Name, err)
	}
	var token [16]byte
	for i := range 4 {
		v := uint32(buf.I32()[1+i])
		token[4*i], token[4*i+1], token[4*i+2], token[4*i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
	}
	addr := os.Getenv("MASTER_ADDR")
	if addr == "" {
		addr = "127.0.0.1"
	}
	return &pluginsdk.CommInfo{Rank: g.Rank(), Size: g.Size(), Addr: addr, Port: int(buf.I32()[0]), Token: hex.EncodeToString(token[:])}, nil
}

func (p *Plugin) has(hook string) bool {
	return p.state != nil && slices.Contains(p.state.hooks, hook)
}

// PreForward implements trainer.PreForwarder.
func (p *Plugin) PreForward(t *trainer.Trainer, info tensor.PassInfo) error {
	if !p.has(pluginsdk.HookPreForward) {
		return nil
	}
	return p.call(pluginsdk.HookPreForward, pluginsdk.PassReq{Micro: info.Micro, Last: info.Last}, nil)
}

// GradReady implements trainer.GradReadier. It only notifies the
// process (see pluginsdk.Notice); PostGrad waits for the notices.
func (p *Plugin) GradReady(t *trainer.Trainer, q *tensor.Tensor, info tensor.PassInfo) error {
	if !p.has(pluginsdk.HookGradReady) {
		return nil
	}
	i, ok := p.state.index[q]
	if !ok {
		return fmt.Errorf("process plugin %s: parameter %s was not in the model at Prepare", p.Info.Name, q.Name)
	}
	if q.Grad != p.state.grads[i] {
		return fmt.Errorf("process plugin %s: the gradient of %s is no longer its place in the shared arena; something replaced p.Grad after Prepare", p.Info.Name, q.Name)
	}
	return p.notify(pluginsdk.Notice{Param: int32(i), Micro: int32(info.Micro), Last: info.Last})
}

// PostGrad implements trainer.PostGrader. It first waits until the
// process has run this micro-batch's GradReady notices, so that their
// errors end the step after backward, as a compiled plugin's do.
func (p *Plugin) PostGrad(t *trainer.Trainer, info tensor.PassInfo) error {
	if !p.has(pluginsdk.HookPostGrad) {
		if p.sent > 0 {
			return p.awaitNotices()
		}
		return nil
	}
	return p.call(pluginsdk.HookPostGrad, pluginsdk.PassReq{Micro: info.Micro, Last: info.Last}, nil)
}

// PreStep implements trainer.PreStepper.
func (p *Plugin) PreStep(t *trainer.Trainer) error {
	if !p.has(pluginsdk.HookPreStep) {
		return nil
	}
	return p.call(pluginsdk.HookPreStep, nil, nil)
}

// PostStep implements trainer.PostStepper.
func (p *Plugin) PostStep(t *trainer.Trainer, m *trainer.StepMetrics) error {
	if !p.has(pluginsdk.HookPostStep) {
		return nil
	}
	return p.call(pluginsdk.HookPostStep, m, nil)
}

// ReduceLoss implements trainer.LossReducer; a plugin without the hook
// leaves the loss as it is.
func (p *Plugin) ReduceLoss(t *trainer.Trainer, loss float64) (float64, error) {
	if !p.has(pluginsdk.HookReduceLoss) {
		return loss, nil
	}
	var out float64
	err := p.call(pluginsdk.HookReduceLoss, loss, &out)
	return out, err
}

// Finish implements trainer.Finisher: the plugin finishes (closing its
// group), then its process ends.
func (p *Plugin) Finish(t *trainer.Trainer) error {
	err := p.call(pluginsdk.HookFinish, nil, nil)
	p.Close()
	return err
}
