package nn

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// The Llama family on GPT-2's seams: the same Embed, Chunks of Blocks and
// Head, whose layers are Llama's. A block is pre-norm with RMSNorm;
// Attn computes q, k and v side by side with three bias-free projections;
// Core turns q and k by their global positions (RoPE) and runs
// grouped-query attention; AttnProj is o_proj; Fc computes gate and up
// side by side, Act is the SwiGLU gate silu(gate)·up, MlpProj is
// down_proj. The head is a final RMSNorm and lm_head, or the embedding
// table when tied. Strategies replace the same seams as for GPT-2.
//
// Parameters carry Hugging Face's Llama names with nn.Linear's [out, in]
// layout, so Hugging Face weights load without renaming or transposes.

// LlamaShape is what a Llama-family model adds to GPTConfig's shape.
type LlamaShape struct {
	NKVHead      int     // key/value heads; divides NHead
	Intermediate int     // SwiGLU width
	RopeTheta    float64 // rotary base
	NormEps      float64 // RMSNorm epsilon
	Tied         bool    // lm_head is embed_tokens
}

// Hugging Face's names of the parameters outside the blocks.
const (
	LlamaEmbedName = "model.embed_tokens.weight"
	LlamaNormName  = "model.norm.weight"
	LlamaHeadName  = "lm_head.weight"
)

// HeadSize is the width of one attention head.
func (c GPTConfig) HeadSize() int { return c.NEmbd / c.NHead }

// KVHeads is the number of key/value heads (NHead for GPT-2).
func (c GPTConfig) KVHeads() int {
	if c.Llama == nil {
		return c.NHead
	}
	return c.Llama.NKVHead
}

// FFN is the width of the MLP's hidden layer (4·n_embd for GPT-2).
func (c GPTConfig) FFN() int {
	if c.Llama == nil {
		return 4 * c.NEmbd
	}
	return c.Llama.Intermediate
}

func (c GPTConfig) validateLlama() error {
	l := c.Llama
	switch {
	case c.NLayer < 1 || c.NHead < 1 || c.NEmbd < 1 || c.BlockSize < 1 || c.VocabSize < 1 || l.NKVHead < 1 || l.Intermediate < 1:
		return fmt.Errorf("nn: every Llama size must be positive, got %+v with %+v", c, *l)
	case c.NEmbd%c.NHead != 0:
		return fmt.Errorf("nn: n_embd=%d is not divisible by n_head=%d", c.NEmbd, c.NHead)
	case c.NHead%l.NKVHead != 0:
		return fmt.Errorf("nn: n_head=%d is not divisible by n_kv_head=%d", c.NHead, l.NKVHead)
	case c.HeadSize()%2 != 0:
		return fmt.Errorf("nn: head size %d is odd; rotary embeddings turn pairs of dimensions", c.HeadSize())
	case !(l.RopeTheta > 0) || !(l.NormEps > 0):
		return fmt.Errorf("nn: rope_theta=%g and norm_eps=%g must be positive", l.RopeTheta, l.NormEps)
	}
	return nil
}

// llamaShapes lists the parameters of the whole Llama in forward order.
func (c GPTConfig) llamaShapes() []ParamShape {
	C, I, hs := c.NEmbd, c.Llama.Intermediate, c.HeadSize()
	q, kv := c.NHead*hs, c.Llama.NKVHead*hs
	out := []ParamShape{{LlamaEmbedName, []int{c.VocabSize, C}}}
	for i := 0; i < c.NLayer; i++ {
		p := fmt.Sprintf("model.layers.%d.", i)
		out = append(out,
			ParamShape{p + "input_layernorm.weight", []int{C}},
			ParamShape{p + "self_attn.q_proj.weight", []int{q, C}},
			ParamShape{p + "self_attn.k_proj.weight", []int{kv, C}},
			ParamShape{p + "self_attn.v_proj.weight", []int{kv, C}},
			ParamShape{p + "self_attn.o_proj.weight", []int{C, q}},
			ParamShape{p + "post_attention_layernorm.weight", []int{C}},
			ParamShape{p + "mlp.gate_proj.weight", []int{I, C}},
			ParamShape{p + "mlp.up_proj.weight", []int{I, C}},
			ParamShape{p + "mlp.down_proj.weight", []int{C, I}})
		out = append(out, c.loraShapes(p[:len(p)-1])...) // lora.go
	}
	out = append(out, ParamShape{LlamaNormName, []int{C}})
	if !c.Llama.Tied {
		out = append(out, ParamShape{LlamaHeadName, []int{c.VocabSize, C}})
	}
	return out
}

func (c GPTConfig) llamaParams() int64 {
	var n int64
	c.LoRA = nil
	for _, s := range c.llamaShapes() {
		k := int64(1)
		for _, d := range s.Shape {
			k *= int64(d)
		}
		n += k
	}
	return n
}

// describeLlamaStage is DescribeStage for a Llama: names, global shapes,
// no storage. Its initial values are Hugging Face's (initOf: every matrix
// normal(0, 0.02), norms one), each a function of (seed, name, element).
func describeLlamaStage(cfg GPTConfig, dtype tensor.DType, alloc *tensor.Allocator, ranges [][2]int) (*GPT, error) {
	if err := checkRanges(cfg, ranges); err != nil {
		return nil, err
	}
	if alloc == nil {
		alloc = tensor.Default
	}
	l := cfg.Llama
	C, I, hs := cfg.NEmbd, l.Intermediate, cfg.HeadSize()
	q, kv := cfg.NHead*hs, l.NKVHead*hs
	newP := func(mod *Module, local string, shape ...int) *tensor.Tensor {
		p := mod.AddParam(local, alloc.NewShell(tensor.Params, dtype, shape...))
		if !cfg.Frozen(p.Name) { // lora.go
			p.RequiresGrad()
		}
		return p
	}
	m := &GPT{Config: cfg}
	if ranges[0][0] == 0 {
		e := &Embed{Module: NewModule("embed", "")}
		e.Wte = newP(e.Module, LlamaEmbedName, cfg.VocabSize, C)
		e.Layer = &TokenEmbedding{Wte: e.Wte}
		m.Embed = e
	}
	for _, r := range ranges {
		c := &Chunk{}
		for i := r[0]; i < r[1]; i++ {
			b := &Block{Module: NewModule(fmt.Sprintf("h.%d", i), fmt.Sprintf("model.layers.%d", i)), Index: i}
			b.Ln1W = newP(b.Module, "input_layernorm.weight", C)
			wq := newP(b.Module, "self_attn.q_proj.weight", q, C)
			wk := newP(b.Module, "self_attn.k_proj.weight", kv, C)
			wv := newP(b.Module, "self_attn.v_proj.weight", kv, C)
			wo := newP(b.Module, "self_attn.o_proj.weight", C, q)
			b.Ln2W = newP(b.Module, "post_attention_layernorm.weight", C)
			wg := newP(b.Module, "mlp.gate_proj.weight", I, C)
			wu := newP(b.Module, "mlp.up_proj.weight", I, C)
			wd := newP(b.Module, "mlp.down_proj.weight", C, I)
			b.Norm1, b.Norm2 = &RMSNorm{W: b.Ln1W, Eps: l.NormEps}, &RMSNorm{W: b.Ln2W, Eps: l.NormEps}
			b.Attn, b.AttnProj = &DenseT{Ws: []*tensor.Tensor{wq, wk, wv}}, &DenseT{Ws: []*tensor.Tensor{wo}}
			b.Core = &CausalAttention{NHead: cfg.NHead, NKVHead: l.NKVHead, RopeTheta: l.RopeTheta}
			b.Fc, b.MlpProj = &DenseT{Ws: []*tensor.Tensor{wg, wu}}, &DenseT{Ws: []*tensor.Tensor{wd}}
			b.Act = tensor.SiluMul
			cfg.addAdapters(b, func(local string, shape ...int) *tensor.Tensor { return newP(b.Module, local, shape...) })
			c.Blocks = append(c.Blocks, b)
		}
		m.Chunks = append(m.Chunks, c)
	}
	if ranges[len(ranges)-1][1] == cfg.NLayer {
		h := &Head{Module: NewModule("head", "")}
		h.LnW = newP(h.Module, LlamaNormName, C)
		h.Norm = &RMSNorm{W: h.LnW, Eps: l.NormEps}
		switch {
		case !l.Tied:
			h.Wte = newP(h.Module, LlamaHeadName, cfg.VocabSize, C)
		case m.Embed != nil:
			h.Wte = m.Embed.Wte
		default:
			// The last stage's copy of the tied table, equal to the first
			// stage's (same seed and name).
			h.Wte = newP(h.Module, LlamaEmbedName, cfg.VocabSize, C)
		}
		h.Out = &TiedHead{Wte: h.Wte}
		m.Head = h
	}
	return m, nil
}

// DenseT is a bias-free Linear with weights in nn.Linear's [out, in]
// layout: x·W₁ᵀ | x·W₂ᵀ | … side by side (Llama's q|k|v and gate|up run
// as one layer each).
type DenseT struct {
	Ws []*tensor.Tensor
}

// Forward implements Layer.
func (d *DenseT) Forward(x *tensor.Tensor, _ Pass) (*tensor.Tensor, error) {
	return tensor.LinearT(x, d.Ws...), nil
}

// RMSNorm is Llama's normalisation over the last dimension with weight W.
type RMSNorm struct {
	W   *tensor.Tensor
	Eps float64
}

// Forward implements Layer.
func (l *RMSNorm) Forward(x *tensor.Tensor, _ Pass) (*tensor.Tensor, error) {
	return tensor.RMSNorm(x, l.W, l.Eps), nil
}

// TokenEmbedding is Llama's input layer: the token embedding alone
// (positions enter through RoPE in attention).
type TokenEmbedding struct {
	Wte *tensor.Tensor
}

// Forward implements Layer on token ids idx [B, T].
func (e *TokenEmbedding) Forward(idx *tensor.Tensor, _ Pass) (*tensor.Tensor, error) {
	return tensor.Embedding(e.Wte, idx), nil
}

// The sizes the memory estimates are built from, per model family.

// ActWidths are the widths of the buffers a block's forward keeps for its
// backward, per row of the sequence, by how tensor parallel holds them:
// whole (as wide as the model: the norms' inputs and outputs, the
// residual stream, the projections' outputs: 6·C for both families) and
// split over the tensor-parallel ranks (GPT-2: q|k|v, the attention
// output, the MLP's hidden layer before and after GELU, 12·C; a Llama:
// q|k|v before and after RoPE, the attention output, gate|up and the
// SwiGLU gate's output, 3·H·hs + 4·K·hs + 3·I).
func (c GPTConfig) ActWidths() (whole, split int64) {
	C := int64(c.NEmbd)
	if c.Llama == nil {
		return 6 * C, 12 * C
	}
	hs := int64(c.HeadSize())
	return 6 * C, 3*int64(c.NHead)*hs + 4*int64(c.KVHeads())*hs + 3*int64(c.FFN())
}

// EmbedActs are the input stage's [B, T, C] outputs (GPT-2: the token
// lookup and its sum with the positions; a Llama: the lookup).
func (c GPTConfig) EmbedActs() int64 {
	if c.Llama == nil {
		return 2
	}
	return 1
}
