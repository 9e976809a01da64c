// Package nn holds modules with hierarchical named parameters, the layers
// strategies can replace, and the GPT-2 model built from them.
//
// A Module is a unit of the model that strategies act on as a whole: ZeRO-3
// gathers one module's weights before its forward and again before its
// backward, a pipeline stage keeps a run of modules. Hooks fire before and
// after a module's forward, when the gradient of its output arrives (before
// its backward runs) and when its backward is done.
//
// Where a parameter lives is decided in one place: the module's parameter
// list. Each parameter carries its global name and a place.Spec (global
// shape, placement per mesh axis); a plugin that replaces a layer with one
// holding a shard registers the shard with SetParam under the same name,
// with its Spec saying which part of the global tensor it is.
package nn

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// HookFunc is called with the module and the micro-batch being run.
type HookFunc func(m *Module, info tensor.PassInfo)

// Hooks are the callbacks of one module, run in registration order.
type Hooks struct {
	PreForward   []HookFunc // before the module's forward
	PostForward  []HookFunc // after the module's forward
	PreBackward  []HookFunc // the gradient of the output arrived; backward is next
	PostBackward []HookFunc // the module's backward is done (its input gradient is ready)
}

// Module is a named group of parameters with hooks.
type Module struct {
	name, prefix string
	params       []*tensor.Tensor
	Hooks        Hooks
}

// NewModule returns an empty module. name identifies the module to
// strategies and in logs ("embed", "h.3", "head"); prefix is what its
// parameters' global names start with ("h.3" gives "h.3.ln_1.weight"; the
// embedding's and the head's parameters have none: "wte.weight",
// "ln_f.weight").
func NewModule(name, prefix string) *Module {
	if name == "" {
		panic("nn: a module needs a name")
	}
	return &Module{name: name, prefix: prefix}
}

// Name identifies the module.
func (m *Module) Name() string { return m.name }

// Params returns the module's parameters in registration order.
func (m *Module) Params() []*tensor.Tensor { return m.params }

// AddParam registers p under the module's prefix: its global name becomes
// prefix + "." + local, and its Spec a replicated tensor of its shape.
func (m *Module) AddParam(local string, p *tensor.Tensor) *tensor.Tensor {
	if m.prefix != "" {
		p.Name = m.prefix + "." + local
	} else {
		p.Name = local
	}
	for _, q := range m.params {
		if q.Name == p.Name {
			panic(fmt.Sprintf("nn: parameter %q registered twice", p.Name))
		}
	}
	p.Spec = place.NewSpec(p.Name, p.Shape())
	m.params = append(m.params, p)
	return p
}

// SetParam replaces the parameter with the same global name (a plugin
// swapping in a shard). p must carry a Spec naming the part of the
// global tensor it is.
func (m *Module) SetParam(p *tensor.Tensor) error {
	if p.Spec == nil || p.Spec.Name != p.Name {
		return fmt.Errorf("nn: SetParam(%s) needs a Spec for %q saying which part of the global tensor it is", p, p.Name)
	}
	if err := p.Spec.Validate(); err != nil {
		return err
	}
	for i, q := range m.params {
		if q.Name == p.Name {
			m.params[i] = p
			return nil
		}
	}
	return fmt.Errorf("nn: module %q has no parameter %q", m.name, p.Name)
}

// DropParam removes the parameter with global name name from the module:
// a plugin that places it on other ranks only (expert parallel keeps each
// rank's experts) leaves this rank without it. It is an error if the
// module has no such parameter.
func (m *Module) DropParam(name string) error {
	for i, q := range m.params {
		if q.Name == name {
			m.params = append(m.params[:i:i], m.params[i+1:]...)
			return nil
		}
	}
	return fmt.Errorf("nn: module %q has no parameter %q", m.name, name)
}

// Run calls body on x between the module's hooks. The backward hooks are
// attached as identity ops on the output (PreBackward) and on the input
// (PostBackward, only when x carries a gradient).
func (m *Module) Run(x *tensor.Tensor, info tensor.PassInfo, body func(x *tensor.Tensor) (*tensor.Tensor, error)) (*tensor.Tensor, error) {
	for _, h := range m.Hooks.PreForward {
		h(m, info)
	}
	if len(m.Hooks.PostBackward) > 0 && x.NeedsGrad() {
		x = tensor.Hook(x, m.name+".post_backward", func(b *tensor.Backprop) {
			for _, h := range m.Hooks.PostBackward {
				h(m, b.Info)
			}
		})
	}
	y, err := body(x)
	if err != nil {
		return nil, err
	}
	for _, h := range m.Hooks.PostForward {
		h(m, info)
	}
	if len(m.Hooks.PreBackward) > 0 && y.NeedsGrad() {
		y = tensor.Hook(y, m.name+".pre_backward", func(b *tensor.Backprop) {
			for _, h := range m.Hooks.PreBackward {
				h(m, b.Info)
			}
		})
	}
	return y, nil
}
