// Package nn holds modules with hierarchical named parameters and the GPT-2
// model built from them.
//
// A Module is a unit of the model that strategies act on as a whole: ZeRO-3
// gathers one module's weights before its forward and again before its
// backward, a pipeline stage keeps a run of modules. Hooks fire before and
// after a module's forward, when the gradient of its output arrives (before
// its backward runs) and when its backward is done.
package nn

import (
	"fmt"

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
	name   string
	params []*tensor.Tensor
	Hooks  Hooks
}

// NewModule returns an empty module with the given hierarchical name
// (e.g. "h.3"; "" for the root).
func NewModule(name string) *Module { return &Module{name: name} }

// Name is the module's hierarchical prefix.
func (m *Module) Name() string { return m.name }

// Params returns the module's parameters in registration order.
func (m *Module) Params() []*tensor.Tensor { return m.params }

// AddParam registers p under the module's prefix: its global name becomes
// prefix + "." + local.
func (m *Module) AddParam(local string, p *tensor.Tensor) *tensor.Tensor {
	if m.name != "" {
		p.Name = m.name + "." + local
	} else {
		p.Name = local
	}
	for _, q := range m.params {
		if q.Name == p.Name {
			panic(fmt.Sprintf("nn: parameter %q registered twice", p.Name))
		}
	}
	m.params = append(m.params, p)
	return p
}

// SetParam replaces the parameter with the same global name (a plugin
// swapping in a shard or a gathered copy).
func (m *Module) SetParam(p *tensor.Tensor) error {
	for i, q := range m.params {
		if q.Name == p.Name {
			m.params[i] = p
			return nil
		}
	}
	return fmt.Errorf("nn: module %q has no parameter %q", m.name, p.Name)
}

// Run calls body on x between the module's hooks. The backward hooks are
// attached as identity ops on the output (PreBackward) and on the input
// (PostBackward, only when x carries a gradient).
func (m *Module) Run(x *tensor.Tensor, info tensor.PassInfo, body func(x *tensor.Tensor) *tensor.Tensor) *tensor.Tensor {
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
	y := body(x)
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
	return y
}
