package nn

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// LoRA: the base weights are frozen (no gradient, so no optimizer state
// and nothing for data parallel to move) and each targeted linear layer
// gains a low-rank adapter beside it,
//
//	y = base(x) + (alpha/rank)·x·Aᵀ·Bᵀ,  A [rank, in], B [out, rank],
//
// A drawn uniform in ±1/√in from (seed, name) like every parameter (the
// bound of PyTorch's kaiming_uniform_(a=√5), PEFT's init) and B zero, so
// the model starts equal to its base. The adapters are parameters of
// their block, named after the layer as PEFT names them inside the
// model: "h.0.attn.c_attn.lora_A.weight". A layer whose output is fused
// (a Llama's q|k|v, gate|up) carries one adapter per targeted weight,
// added into that weight's columns.

// LoRAShape is what LoRA adds to a model's shape (nil: every weight
// trains).
type LoRAShape struct {
	Rank        int
	Alpha       float64
	Targets     []string // module names, matched as config.LoRATargeted does
	TrainBiases bool     // the base's biases train too
	// Dropout is the probability an element of an adapter's input is
	// dropped in a training forward; the mask is drawn from Seed, the
	// adapter, the step and the element's place (Adapter.Drop).
	Dropout float64
	Seed    int64
}

// Scale is alpha/rank.
func (l *LoRAShape) Scale() float64 { return l.Alpha / float64(l.Rank) }

// targets reports whether module ("attn.c_attn") is targeted: equal to a
// target or ending with "." and one (PEFT's rule).
func (l *LoRAShape) targets(module string) bool {
	for _, t := range l.Targets {
		if module == t || strings.HasSuffix(module, "."+t) {
			return true
		}
	}
	return false
}

// LoRATarget is one linear weight of a block adapters can sit beside.
type LoRATarget struct {
	Module string // its name inside the block: "attn.c_attn", "self_attn.q_proj"
	In     int    // input width
	Out    int    // output width
	// Lo is where the weight's output starts in its layer's fused output
	// (q|k|v, gate|up); 0 for a layer of one weight.
	Lo int
	// Slot is the block's layer that computes it.
	Slot Slot
}

// Slot names one of a block's four linear layers.
type Slot int

// The linear layers of a block.
const (
	SlotAttn     Slot = iota // Block.Attn: c_attn; q|k|v
	SlotAttnProj             // Block.AttnProj: attn.c_proj; o_proj
	SlotFc                   // Block.Fc: mlp.c_fc; gate|up
	SlotMlpProj              // Block.MlpProj: mlp.c_proj; down_proj
)

// Layer returns the block's field for slot s.
func (b *Block) Layer(s Slot) *Layer {
	return [...]*Layer{&b.Attn, &b.AttnProj, &b.Fc, &b.MlpProj}[s]
}

// LoRATargets lists the linear weights of a block in forward order.
func (c GPTConfig) LoRATargets() []LoRATarget {
	C := c.NEmbd
	if c.Llama == nil {
		return []LoRATarget{{"attn.c_attn", C, 3 * C, 0, SlotAttn}, {"attn.c_proj", C, C, 0, SlotAttnProj},
			{"mlp.c_fc", C, 4 * C, 0, SlotFc}, {"mlp.c_proj", 4 * C, C, 0, SlotMlpProj}}
	}
	hs, I := c.HeadSize(), c.Llama.Intermediate
	q, kv := c.NHead*hs, c.Llama.NKVHead*hs
	return []LoRATarget{{"self_attn.q_proj", C, q, 0, SlotAttn}, {"self_attn.k_proj", C, kv, q, SlotAttn},
		{"self_attn.v_proj", C, kv, q + kv, SlotAttn}, {"self_attn.o_proj", q, C, 0, SlotAttnProj},
		{"mlp.gate_proj", C, I, 0, SlotFc}, {"mlp.up_proj", C, I, I, SlotFc}, {"mlp.down_proj", I, C, 0, SlotMlpProj}}
}

// Adapted lists the targets that carry adapters (none without LoRA).
func (c GPTConfig) Adapted() []LoRATarget {
	if c.LoRA == nil {
		return nil
	}
	var out []LoRATarget
	for _, t := range c.LoRATargets() {
		if c.LoRA.targets(t.Module) {
			out = append(out, t)
		}
	}
	return out
}

// Adapter names of target t in the block whose parameters start with
// prefix ("h.0", "model.layers.0").
func LoRANames(prefix string, t LoRATarget) (a, b string) {
	return prefix + "." + t.Module + ".lora_A.weight", prefix + "." + t.Module + ".lora_B.weight"
}

// IsAdapter reports whether a parameter name is an adapter's.
func IsAdapter(name string) bool {
	return strings.HasSuffix(name, ".lora_A.weight") || strings.HasSuffix(name, ".lora_B.weight")
}

// Frozen reports whether the parameter named name takes no gradient: under
// LoRA every base weight, and the biases unless they train.
func (c GPTConfig) Frozen(name string) bool {
	if c.LoRA == nil || IsAdapter(name) {
		return false
	}
	return !(c.LoRA.TrainBiases && strings.HasSuffix(name, ".bias"))
}

// loraShapes are the adapters of block i (prefix "h.i" or
// "model.layers.i").
func (c GPTConfig) loraShapes(prefix string) []ParamShape {
	var out []ParamShape
	for _, t := range c.Adapted() {
		a, b := LoRANames(prefix, t)
		out = append(out, ParamShape{a, []int{c.LoRA.Rank, t.In}}, ParamShape{b, []int{t.Out, c.LoRA.Rank}})
	}
	return out
}

// BaseShapes are ParamShapes without the adapters: what a base weights
// file (init_from, the base of an adapter file) holds.
func (c GPTConfig) BaseShapes() []ParamShape {
	c.LoRA = nil
	return c.ParamShapes()
}

// TrainedShapes are the parameters that take a gradient, in forward
// order: every one without LoRA, the adapters (and the biases under
// lora.train_biases=all) with it.
func (c GPTConfig) TrainedShapes() []ParamShape {
	var out []ParamShape
	for _, ps := range c.ParamShapes() {
		if !c.Frozen(ps.Name) {
			out = append(out, ps)
		}
	}
	return out
}

// loraInit is an adapter's initial value rule: A uniform in ±1/√in, B
// zero. ok is false for a parameter that is no adapter.
func loraInit(name string, shape []int) (bound float64, ok bool) {
	switch {
	case strings.HasSuffix(name, ".lora_A.weight"):
		return 1 / math.Sqrt(float64(shape[len(shape)-1])), true
	case strings.HasSuffix(name, ".lora_B.weight"):
		return 0, true
	}
	return 0, false
}

// Adapter is the low-rank update of one weight of a layer: Scale·x·Aᵀ·Bᵀ
// added into the layer's output columns [Lo, Lo+out).
type Adapter struct {
	A, B  *tensor.Tensor
	Scale float64
	Lo    int
	// Dropout on the input (0: none), drawn from Seed. In is the input's
	// global width and Col0 the first global column of the input this
	// rank holds (a row-parallel layer's part; 0 otherwise).
	Dropout  float64
	Seed     int64
	In, Col0 int
}

// maxPositions bounds the positions a dropout index leaves room for: a
// context of a million tokens.
const maxPositions = 1 << 20

// Drop applies the adapter's dropout to its input x [B, T, k] in a
// training forward. Element (b, t, c) is dropped by a draw indexed by its
// sequence in the step's global batch (p.Info.Sample0 + b), its position
// (t, or p.Pos[t]) and its global column (Col0 + c), from the generator of
// (Seed, A's name, step): the mask of every layout is one process's.
func (a *Adapter) Drop(x *tensor.Tensor, p Pass) *tensor.Tensor {
	if a.Dropout == 0 || !p.Info.Train {
		return x
	}
	T := x.Dim(-2)
	r := NewRand(a.Seed, fmt.Sprintf("%s.dropout.%d", a.A.Name, p.Info.Step))
	return tensor.Dropout(x, a.Dropout, func(row, col int) bool {
		b, t := row/T, row%T
		if p.Pos != nil {
			t = p.Pos[t]
		}
		i := ((p.Info.Sample0+b)*maxPositions+t)*a.In + a.Col0 + col
		return (r.UniformAt(i)+1)/2 < a.Dropout
	})
}

// Update is Scale·x·Aᵀ·Bᵀ (the scale applied at the rank-wide middle).
func (a *Adapter) Update(x *tensor.Tensor) *tensor.Tensor {
	return tensor.MatMulT(tensor.Scale(tensor.MatMulT(x, a.A), a.Scale), a.B)
}

// AddTo adds the update of x into y's columns.
func (a *Adapter) AddTo(y, x *tensor.Tensor, p Pass) *tensor.Tensor {
	d := a.Update(a.Drop(x, p))
	if a.Lo == 0 && d.Dim(-1) == y.Dim(-1) {
		return tensor.Add(y, d)
	}
	return tensor.AddColumns(y, d, a.Lo)
}

// LoRALinear is a frozen linear layer with its adapters.
type LoRALinear struct {
	Base     Layer
	Adapters []*Adapter
}

// Forward implements Layer.
func (l *LoRALinear) Forward(x *tensor.Tensor, p Pass) (*tensor.Tensor, error) {
	y, err := l.Base.Forward(x, p)
	if err != nil {
		return nil, err
	}
	for _, a := range l.Adapters {
		y = a.AddTo(y, x, p)
	}
	return y, nil
}

// addAdapters registers block b's adapters (after its base parameters)
// and wraps its targeted layers; newP registers a parameter of b.
func (c GPTConfig) addAdapters(b *Block, newP func(local string, shape ...int) *tensor.Tensor) {
	if c.LoRA == nil {
		return
	}
	for _, t := range c.Adapted() {
		a := newP(t.Module+".lora_A.weight", c.LoRA.Rank, t.In)
		bw := newP(t.Module+".lora_B.weight", t.Out, c.LoRA.Rank)
		slot := b.Layer(t.Slot)
		ll, ok := (*slot).(*LoRALinear)
		if !ok {
			ll = &LoRALinear{Base: *slot}
			*slot = ll
		}
		ll.Adapters = append(ll.Adapters, &Adapter{A: a, B: bw, Scale: c.LoRA.Scale(), Lo: t.Lo,
			Dropout: c.LoRA.Dropout, Seed: c.LoRA.Seed, In: t.In})
	}
}

// Adapters returns the adapters of a layer (none for a plain one).
func Adapters(l Layer) []*Adapter {
	if ll, ok := l.(*LoRALinear); ok {
		return ll.Adapters
	}
	return nil
}

// Unwrap returns the base of a layer with adapters, or the layer.
func Unwrap(l Layer) Layer {
	if ll, ok := l.(*LoRALinear); ok {
		return ll.Base
	}
	return l
}

// TrainedParams are the model's parameters that take a gradient.
func (m *GPT) TrainedParams() []*tensor.Tensor {
	return slices.DeleteFunc(m.Params(), func(p *tensor.Tensor) bool { return !p.NeedsGrad() })
}
