// Package optim holds the optimizers (AdamW with PyTorch semantics, SGD with
// momentum), global gradient-norm clipping and learning-rate schedules.
//
// Optimizers work on lists of parameters whose gradients are in p.Grad.
// Sharded strategies (ZeRO) hand them views of the shards they own, with the
// weight-decay choice made per view.
package optim

import (
	"fmt"
	"math"

	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
)

// Optimizer updates parameters from their gradients.
type Optimizer interface {
	// Step applies one update with learning rate lr to every parameter
	// that has a gradient.
	Step(lr float64) error
	// Params lists the parameters the optimizer updates.
	Params() []*tensor.Tensor
	// State returns the optimizer's buffers by name (for checkpoints and
	// accounting), e.g. "exp_avg.h.0.ln_1.weight".
	State() map[string]*tensor.Tensor
}

// ScaledStepper is an optimizer that can take its step on its gradients
// multiplied by a factor as it reads them, leaving the gradients as they
// are: the trainer's unscaling (fp16 loss scaling) and clipping folded
// into the update rather than a pass of their own over every gradient.
type ScaledStepper interface {
	// StepScaled is Step on the gradients times gradScale, bitwise.
	StepScaled(lr, gradScale float64) error
}

// StepScaled takes o's step with learning rate lr on its gradients
// multiplied by s: in the update where o can (ScaledStepper), else
// multiplying the gradients first (ScaleGrads).
func StepScaled(o Optimizer, lr, s float64) error {
	if ss, ok := o.(ScaledStepper); ok {
		return ss.StepScaled(lr, s)
	}
	ScaleGrads(o.Params(), s)
	return o.Step(lr)
}

// StepCounter is an optimizer whose update depends on how many steps each
// parameter has taken (AdamW's bias correction). The count is not a buffer
// of State, so it is read and restored on its own when resuming: without
// it a resumed run would correct its moments as if it were at step 1.
type StepCounter interface {
	// Steps returns the number of updates each parameter has had, by
	// parameter name; parameters never updated are absent.
	Steps() map[string]int
	// SetSteps replaces the counts (parameters not in counts restart at
	// 0); a name that is not one of the optimizer's parameters is an error.
	SetSteps(counts map[string]int) error
}

// PerParam is an optimizer whose state can be read and written one
// parameter at a time, which is how checkpoints store it: by the
// parameter's global name, whatever the layout.
type PerParam interface {
	// StateOf returns p's buffers by kind ("exp_avg", "exp_avg_sq",
	// "momentum_buffer"), those that exist, and p's step count.
	StateOf(p *tensor.Tensor) (bufs map[string]*tensor.Tensor, steps int)
	// EnsureState returns p's buffer of the given kind, creating it
	// zeroed if the optimizer makes it lazily, to be filled from a
	// checkpoint.
	EnsureState(p *tensor.Tensor, kind string) (*tensor.Tensor, error)
	// SetStepsOf sets p's step count.
	SetStepsOf(p *tensor.Tensor, n int)
	// DecayOf is p's weight decay.
	DecayOf(p *tensor.Tensor) float64
}

// Group is a set of parameters sharing a weight-decay setting.
type Group struct {
	Params      []*tensor.Tensor
	WeightDecay float64
}

// DecayGroups splits params the way GPT-2 training does: weight decay for
// tensors of 2 or more dimensions (matrices, embeddings), none for biases
// and LayerNorm parameters.
func DecayGroups(params []*tensor.Tensor, wd float64) []Group {
	var decay, none []*tensor.Tensor
	for _, p := range params {
		if len(p.Shape()) >= 2 {
			decay = append(decay, p)
		} else {
			none = append(none, p)
		}
	}
	return []Group{{Params: decay, WeightDecay: wd}, {Params: none, WeightDecay: 0}}
}

// AdamWConfig holds AdamW's hyper-parameters (PyTorch defaults differ; these
// are GPT training's).
type AdamWConfig struct {
	Beta1, Beta2, Eps float64
}

// AdamW is torch.optim.AdamW: decoupled weight decay, bias-corrected moments.
type AdamW struct {
	cfg    AdamWConfig
	groups []Group
	m, v   map[*tensor.Tensor]*tensor.Tensor
	steps  map[*tensor.Tensor]int
	alloc  *tensor.Allocator
}

// NewAdamW returns AdamW over the groups; moment buffers are allocated (as
// optimizer state, zeroed) from alloc (nil = tensor.Default).
func NewAdamW(cfg AdamWConfig, groups []Group, alloc *tensor.Allocator) *AdamW {
	if alloc == nil {
		alloc = tensor.Default
	}
	o := &AdamW{cfg: cfg, groups: groups, alloc: alloc,
		m: map[*tensor.Tensor]*tensor.Tensor{}, v: map[*tensor.Tensor]*tensor.Tensor{}, steps: map[*tensor.Tensor]int{}}
	for _, g := range groups {
		for _, p := range g.Params {
			o.m[p] = alloc.New(tensor.OptimState, p.DType(), p.Shape()...)
			o.v[p] = alloc.New(tensor.OptimState, p.DType(), p.Shape()...)
		}
	}
	return o
}

// Params implements Optimizer.
func (o *AdamW) Params() []*tensor.Tensor {
	var out []*tensor.Tensor
	for _, g := range o.groups {
		out = append(out, g.Params...)
	}
	return out
}

// State implements Optimizer.
func (o *AdamW) State() map[string]*tensor.Tensor {
	s := map[string]*tensor.Tensor{}
	for p, m := range o.m {
		s["exp_avg."+p.Name] = m
		s["exp_avg_sq."+p.Name] = o.v[p]
	}
	return s
}

// Steps implements StepCounter.
func (o *AdamW) Steps() map[string]int {
	out := map[string]int{}
	for p, n := range o.steps {
		if n > 0 {
			out[p.Name] = n
		}
	}
	return out
}

// SetSteps implements StepCounter.
func (o *AdamW) SetSteps(counts map[string]int) error {
	byName := map[string]*tensor.Tensor{}
	for _, p := range o.Params() {
		byName[p.Name] = p
	}
	steps := map[*tensor.Tensor]int{}
	for name, n := range counts {
		p, ok := byName[name]
		if !ok {
			return fmt.Errorf("optim: AdamW has no parameter %q to set the step count of (was the state saved from another model?)", name)
		}
		if n < 0 {
			return fmt.Errorf("optim: step count %d of %s must be >= 0", n, name)
		}
		steps[p] = n
	}
	o.steps = steps
	return nil
}

// StateOf implements PerParam.
func (o *AdamW) StateOf(p *tensor.Tensor) (map[string]*tensor.Tensor, int) {
	m, ok := o.m[p]
	if !ok {
		return nil, 0
	}
	return map[string]*tensor.Tensor{"exp_avg": m, "exp_avg_sq": o.v[p]}, o.steps[p]
}

// EnsureState implements PerParam.
func (o *AdamW) EnsureState(p *tensor.Tensor, kind string) (*tensor.Tensor, error) {
	bufs, _ := o.StateOf(p)
	if b, ok := bufs[kind]; ok {
		return b, nil
	}
	return nil, fmt.Errorf("optim: AdamW keeps no %q for %s", kind, p.Name)
}

// SetStepsOf implements PerParam.
func (o *AdamW) SetStepsOf(p *tensor.Tensor, n int) { o.steps[p] = n }

// DecayOf implements PerParam.
func (o *AdamW) DecayOf(p *tensor.Tensor) float64 { return decayOf(o.groups, p) }

func decayOf(groups []Group, p *tensor.Tensor) float64 {
	for _, g := range groups {
		for _, q := range g.Params {
			if q == p {
				return g.WeightDecay
			}
		}
	}
	return 0
}

// Step implements Optimizer.
func (o *AdamW) Step(lr float64) error { return o.StepScaled(lr, 1) }

// StepScaled implements ScaledStepper: the gradient's scale is one more
// factor of the update (cpu.AdamWScaled).
func (o *AdamW) StepScaled(lr, gradScale float64) error {
	for _, g := range o.groups {
		for _, p := range g.Params {
			if p.Grad == nil {
				continue
			}
			o.steps[p]++
			t := o.steps[p]
			m, v := o.m[p], o.v[p]
			switch p.DType() {
			case tensor.Float32:
				cpu.AdamWScaled(p.F32(), p.Grad.F32(), m.F32(), v.F32(), gradScale, lr, o.cfg.Beta1, o.cfg.Beta2, o.cfg.Eps, g.WeightDecay, t)
			case tensor.Float64:
				cpu.AdamWScaled(p.F64(), p.Grad.F64(), m.F64(), v.F64(), gradScale, lr, o.cfg.Beta1, o.cfg.Beta2, o.cfg.Eps, g.WeightDecay, t)
			default:
				return fmt.Errorf("optim: AdamW cannot update %s", p)
			}
		}
	}
	return nil
}

// SGD is stochastic gradient descent with momentum and (coupled, as in
// torch.optim.SGD) weight decay.
type SGD struct {
	Momentum float64
	groups   []Group
	buf      map[*tensor.Tensor]*tensor.Tensor
	alloc    *tensor.Allocator
}

// NewSGD returns SGD over the groups.
func NewSGD(momentum float64, groups []Group, alloc *tensor.Allocator) *SGD {
	if alloc == nil {
		alloc = tensor.Default
	}
	return &SGD{Momentum: momentum, groups: groups, buf: map[*tensor.Tensor]*tensor.Tensor{}, alloc: alloc}
}

// Params implements Optimizer.
func (o *SGD) Params() []*tensor.Tensor {
	var out []*tensor.Tensor
	for _, g := range o.groups {
		out = append(out, g.Params...)
	}
	return out
}

// State implements Optimizer.
func (o *SGD) State() map[string]*tensor.Tensor {
	s := map[string]*tensor.Tensor{}
	for p, b := range o.buf {
		s["momentum_buffer."+p.Name] = b
	}
	return s
}

// StateOf implements PerParam (SGD counts no steps).
func (o *SGD) StateOf(p *tensor.Tensor) (map[string]*tensor.Tensor, int) {
	if b, ok := o.buf[p]; ok {
		return map[string]*tensor.Tensor{"momentum_buffer": b}, 0
	}
	return nil, 0
}

// EnsureState implements PerParam.
func (o *SGD) EnsureState(p *tensor.Tensor, kind string) (*tensor.Tensor, error) {
	if kind != "momentum_buffer" || o.Momentum == 0 {
		return nil, fmt.Errorf("optim: SGD (momentum %v) keeps no %q for %s", o.Momentum, kind, p.Name)
	}
	b, ok := o.buf[p]
	if !ok {
		b = o.alloc.New(tensor.OptimState, p.DType(), p.Shape()...)
		o.buf[p] = b
	}
	return b, nil
}

// SetStepsOf implements PerParam: SGD's update does not depend on it.
func (o *SGD) SetStepsOf(p *tensor.Tensor, n int) {}

// DecayOf implements PerParam.
func (o *SGD) DecayOf(p *tensor.Tensor) float64 { return decayOf(o.groups, p) }

// Step implements Optimizer: d = g + wd·p; buf = μ·buf + d (buf = d at the
// first step); p -= lr·buf.
func (o *SGD) Step(lr float64) error {
	for _, g := range o.groups {
		for _, p := range g.Params {
			if p.Grad == nil {
				continue
			}
			n := p.Numel()
			d := make([]float64, n)
			for i := range d {
				d[i] = p.Grad.At(i) + g.WeightDecay*p.At(i)
			}
			if o.Momentum != 0 {
				b, ok := o.buf[p]
				if !ok {
					b = o.alloc.New(tensor.OptimState, p.DType(), p.Shape()...)
					o.buf[p] = b
					for i := range d {
						b.Set(i, d[i])
					}
				} else {
					for i := range d {
						b.Set(i, o.Momentum*b.At(i)+d[i])
					}
				}
				for i := range d {
					d[i] = b.At(i)
				}
			}
			for i := range d {
				p.Set(i, p.At(i)-lr*d[i])
			}
		}
	}
	return nil
}

// GradSumSquares returns the sum of squares of all gradients, in float64.
// Sharded strategies sum it over ranks before taking the square root.
func GradSumSquares(params []*tensor.Tensor) float64 {
	var s float64
	for _, p := range params {
		if p.Grad == nil {
			continue
		}
		switch p.Grad.DType() {
		case tensor.Float32:
			s += cpu.SumSquares(p.Grad.F32())
		case tensor.Float64:
			s += cpu.SumSquares(p.Grad.F64())
		}
	}
	return s
}

// ClipCoef is the factor torch.nn.utils.clip_grad_norm_ multiplies gradients
// by: max/(norm+1e-6), at most 1. A max of 0 turns clipping off (factor 1).
func ClipCoef(norm, max float64) float64 {
	if max <= 0 {
		return 1
	}
	return math.Min(1, max/(norm+1e-6))
}

// ScaleGrads multiplies every gradient by s.
func ScaleGrads(params []*tensor.Tensor, s float64) {
	if s == 1 {
		return
	}
	for _, p := range params {
		if p.Grad == nil {
			continue
		}
		switch p.Grad.DType() {
		case tensor.Float32:
			cpu.Scale(p.Grad.F32(), float32(s))
		case tensor.Float64:
			cpu.Scale(p.Grad.F64(), s)
		}
	}
}

// ClipGradNorm clips the global gradient norm of params to max (0 = off)
// and returns the norm before clipping.
func ClipGradNorm(params []*tensor.Tensor, max float64) float64 {
	norm := math.Sqrt(GradSumSquares(params))
	ScaleGrads(params, ClipCoef(norm, max))
	return norm
}
