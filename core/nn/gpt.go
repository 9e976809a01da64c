package nn

import (
	"fmt"
	"math"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// GPTConfig is the shape of a GPT-2 model.
type GPTConfig struct {
	NLayer    int
	NHead     int
	NEmbd     int
	BlockSize int
	VocabSize int
}

// Validate reports a configuration the model cannot be built with.
func (c GPTConfig) Validate() error {
	switch {
	case c.NLayer < 1 || c.NHead < 1 || c.NEmbd < 1 || c.BlockSize < 1 || c.VocabSize < 1:
		return fmt.Errorf("nn: every GPT size must be positive, got %+v", c)
	case c.NEmbd%c.NHead != 0:
		return fmt.Errorf("nn: n_embd=%d is not divisible by n_head=%d", c.NEmbd, c.NHead)
	}
	return nil
}

// NumParams is Ψ, the number of parameters (the tied head counted once).
func (c GPTConfig) NumParams() int64 {
	C, L := int64(c.NEmbd), int64(c.NLayer)
	perBlock := 2*C + (C*3*C + 3*C) + (C*C + C) + 2*C + (C*4*C + 4*C) + (4*C*C + C)
	return int64(c.VocabSize)*C + int64(c.BlockSize)*C + L*perBlock + 2*C
}

// FLOPsPerToken is the training cost of one token: 6Ψ for the matrix
// products of forward and backward plus 6·L·C·T for attention.
func (c GPTConfig) FLOPsPerToken() float64 {
	return 6*float64(c.NumParams()) + 6*float64(c.NLayer*c.NEmbd*c.BlockSize)
}

// LayerNormEps is GPT-2's LayerNorm epsilon.
const LayerNormEps = 1e-5

// GPT is GPT-2: an input stage (token and position embeddings), a list of
// transformer blocks, and an output stage (final LayerNorm and the head tied
// to the token embedding). Parameters carry their Hugging Face GPT-2 names.
type GPT struct {
	Config GPTConfig
	Embed  *Embed
	Blocks []*Block
	Head   *Head
}

// Embed is the input stage: wte and wpe.
type Embed struct {
	*Module
	Wte, Wpe *tensor.Tensor
}

// Block is one transformer block, pre-LayerNorm.
type Block struct {
	*Module
	NHead                int
	Ln1W, Ln1B           *tensor.Tensor
	AttnW, AttnB         *tensor.Tensor // c_attn [C, 3C], [3C]
	AttnProjW, AttnProjB *tensor.Tensor // attn.c_proj [C, C], [C]
	Ln2W, Ln2B           *tensor.Tensor
	FcW, FcB             *tensor.Tensor // mlp.c_fc [C, 4C], [4C]
	MlpProjW, MlpProjB   *tensor.Tensor // mlp.c_proj [4C, C], [C]
}

// Head is the output stage: ln_f, then logits against the tied wte.
type Head struct {
	*Module
	LnW, LnB *tensor.Tensor
	Wte      *tensor.Tensor // the same tensor as Embed.Wte
}

// NewGPT builds the model with GPT-2 initialisation: weights normal(0, 0.02),
// the residual projections scaled by 1/sqrt(2·n_layer), biases zero,
// LayerNorm weights one. Each parameter's numbers depend only on (seed, name).
// Parameters come from alloc (nil = tensor.Default), and so do the
// activations computed from them.
func NewGPT(cfg GPTConfig, seed int64, dtype tensor.DType, alloc *tensor.Allocator) (*GPT, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	C := cfg.NEmbd
	m := &GPT{Config: cfg}
	if alloc == nil {
		alloc = tensor.Default
	}
	newP := func(mod *Module, local string, shape ...int) *tensor.Tensor {
		p := alloc.New(tensor.Params, dtype, shape...)
		return mod.AddParam(local, p).RequiresGrad()
	}
	const std = 0.02
	projStd := std / math.Sqrt(2*float64(cfg.NLayer))

	e := &Embed{Module: NewModule("")}
	e.Wte = newP(e.Module, "wte.weight", cfg.VocabSize, C)
	e.Wpe = newP(e.Module, "wpe.weight", cfg.BlockSize, C)
	FillNormal(e.Wte, seed, std)
	FillNormal(e.Wpe, seed, std)
	m.Embed = e

	for i := 0; i < cfg.NLayer; i++ {
		b := &Block{Module: NewModule(fmt.Sprintf("h.%d", i)), NHead: cfg.NHead}
		b.Ln1W = newP(b.Module, "ln_1.weight", C)
		b.Ln1B = newP(b.Module, "ln_1.bias", C)
		b.AttnW = newP(b.Module, "attn.c_attn.weight", C, 3*C)
		b.AttnB = newP(b.Module, "attn.c_attn.bias", 3*C)
		b.AttnProjW = newP(b.Module, "attn.c_proj.weight", C, C)
		b.AttnProjB = newP(b.Module, "attn.c_proj.bias", C)
		b.Ln2W = newP(b.Module, "ln_2.weight", C)
		b.Ln2B = newP(b.Module, "ln_2.bias", C)
		b.FcW = newP(b.Module, "mlp.c_fc.weight", C, 4*C)
		b.FcB = newP(b.Module, "mlp.c_fc.bias", 4*C)
		b.MlpProjW = newP(b.Module, "mlp.c_proj.weight", 4*C, C)
		b.MlpProjB = newP(b.Module, "mlp.c_proj.bias", C)
		Fill(b.Ln1W, 1)
		Fill(b.Ln2W, 1)
		FillNormal(b.AttnW, seed, std)
		FillNormal(b.FcW, seed, std)
		FillNormal(b.AttnProjW, seed, projStd)
		FillNormal(b.MlpProjW, seed, projStd)
		m.Blocks = append(m.Blocks, b)
	}

	h := &Head{Module: NewModule(""), Wte: e.Wte}
	h.LnW = newP(h.Module, "ln_f.weight", C)
	h.LnB = newP(h.Module, "ln_f.bias", C)
	Fill(h.LnW, 1)
	m.Head = h
	return m, nil
}

// Modules lists the units in forward order: embed, blocks, head.
func (m *GPT) Modules() []*Module {
	out := []*Module{m.Embed.Module}
	for _, b := range m.Blocks {
		out = append(out, b.Module)
	}
	return append(out, m.Head.Module)
}

// Params returns every parameter once (the tied wte once), in forward order.
func (m *GPT) Params() []*tensor.Tensor {
	var out []*tensor.Tensor
	for _, mod := range m.Modules() {
		out = append(out, mod.Params()...)
	}
	return out
}

// Param returns the parameter with a global name, or nil.
func (m *GPT) Param(name string) *tensor.Tensor {
	for _, p := range m.Params() {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// Forward of the input stage: token plus position embeddings of idx [B, T];
// posOffset is the global position of idx's first column.
func (e *Embed) Forward(idx *tensor.Tensor, posOffset int, info tensor.PassInfo) *tensor.Tensor {
	for _, h := range e.Hooks.PreForward {
		h(e.Module, info)
	}
	x := tensor.AddPositions(tensor.Embedding(e.Wte, idx), e.Wpe, posOffset)
	for _, h := range e.Hooks.PostForward {
		h(e.Module, info)
	}
	if len(e.Hooks.PreBackward) > 0 && x.NeedsGrad() {
		x = tensor.Hook(x, "embed.pre_backward", func(b *tensor.Backprop) {
			for _, h := range e.Hooks.PreBackward {
				h(e.Module, b.Info)
			}
		})
	}
	return x
}

// Forward of one block on x [B, T, C].
func (b *Block) Forward(x *tensor.Tensor, info tensor.PassInfo) *tensor.Tensor {
	return b.Run(x, info, func(x *tensor.Tensor) *tensor.Tensor {
		h := tensor.LayerNorm(x, b.Ln1W, b.Ln1B, LayerNormEps)
		h = tensor.Linear(h, b.AttnW, b.AttnB)
		h = tensor.CausalSelfAttention(h, b.NHead)
		h = tensor.Linear(h, b.AttnProjW, b.AttnProjB)
		x = tensor.Add(x, h)
		h = tensor.LayerNorm(x, b.Ln2W, b.Ln2B, LayerNormEps)
		h = tensor.Linear(h, b.FcW, b.FcB)
		h = tensor.Gelu(h)
		h = tensor.Linear(h, b.MlpProjW, b.MlpProjB)
		return tensor.Add(x, h)
	})
}

// Forward of the output stage: logits [B, T, V].
func (h *Head) Forward(x *tensor.Tensor, info tensor.PassInfo) *tensor.Tensor {
	return h.Run(x, info, func(x *tensor.Tensor) *tensor.Tensor {
		x = tensor.LayerNorm(x, h.LnW, h.LnB, LayerNormEps)
		return tensor.MatMulT(x, h.Wte)
	})
}

// Logits runs the whole model on idx [B, T].
func (m *GPT) Logits(idx *tensor.Tensor, info tensor.PassInfo) *tensor.Tensor {
	if t := idx.Dim(-1); t > m.Config.BlockSize {
		panic(fmt.Sprintf("nn: sequence of %d tokens exceeds block_size %d", t, m.Config.BlockSize))
	}
	x := m.Embed.Forward(idx, 0, info)
	for _, b := range m.Blocks {
		x = b.Forward(x, info)
	}
	return m.Head.Forward(x, info)
}

// Loss returns the mean cross-entropy of the model's predictions of targets
// [B, T] from idx [B, T].
func (m *GPT) Loss(idx, targets *tensor.Tensor, info tensor.PassInfo) *tensor.Tensor {
	return tensor.CrossEntropy(m.Logits(idx, info), targets)
}
