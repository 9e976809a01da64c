package nn

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// GPTConfig is the shape of a GPT-2 model.
type GPTConfig struct {
	NLayer    int
	NHead     int
	NEmbd     int
	BlockSize int
	VocabSize int
	MoE       MoEConfig // mixture-of-experts blocks (moe.go); zero = dense
	// LoRA freezes the base and adds adapters (lora.go); nil trains
	// every weight.
	LoRA *LoRAShape
	// Llama describes a Llama-family model (llama.go); nil for GPT-2.
	Llama *LlamaShape
}

// Validate reports a configuration the model cannot be built with.
func (c GPTConfig) Validate() error {
	switch {
	case c.Llama != nil:
		return c.validateLlama()
	case c.NLayer < 1 || c.NHead < 1 || c.NEmbd < 1 || c.BlockSize < 1 || c.VocabSize < 1:
		return fmt.Errorf("nn: every GPT size must be positive, got %+v", c)
	case c.NEmbd%c.NHead != 0:
		return fmt.Errorf("nn: n_embd=%d is not divisible by n_head=%d", c.NEmbd, c.NHead)
	}
	return c.MoE.Validate()
}

// NumParams is Ψ, the number of parameters (the tied head counted once).
func (c GPTConfig) NumParams() int64 {
	if c.Llama != nil {
		return c.llamaParams()
	}
	C, L := int64(c.NEmbd), int64(c.NLayer)
	perBlock := 2*C + (C*3*C + 3*C) + (C*C + C) + 2*C + (C*4*C + 4*C) + (4*C*C + C)
	return int64(c.VocabSize)*C + int64(c.BlockSize)*C + L*perBlock + 2*C + c.moeExtraParams(c.MoE.Experts)
}

// FLOPsPerToken is the training cost of one token: 6Ψ for the matrix
// products of forward and backward plus 6·L·C·T for attention. Under
// LoRA the frozen base's weight gradients are not formed: 4Ψ for the
// base (forward and input gradients) and 6 per adapter parameter.
func (c GPTConfig) FLOPsPerToken() float64 {
	attn := 6 * float64(c.NLayer*c.NEmbd*c.BlockSize)
	if c.LoRA != nil {
		var adapters int64
		for _, ps := range c.ParamShapes() {
			if IsAdapter(ps.Name) {
				adapters += int64(ps.Shape[0] * ps.Shape[1])
			}
		}
		return 4*float64(c.ActiveParams()) + 6*float64(adapters) + attn
	}
	return 6*float64(c.ActiveParams()) + attn
}

// LayerNormEps is GPT-2's LayerNorm epsilon.
const LayerNormEps = 1e-5

// GPT is GPT-2, or the part of it one pipeline rank holds: an input stage
// (token and position embeddings), one or more chunks of consecutive
// transformer blocks, and an output stage (final LayerNorm and the head
// tied to the token embedding). The whole model is one chunk of every
// block with both stages. Parameters carry their Hugging Face GPT-2 names.
type GPT struct {
	Config GPTConfig
	Embed  *Embed   // nil unless this model holds block 0's input
	Chunks []*Chunk // in model order
	Head   *Head    // nil unless this model holds the last block's output
}

// Chunk is a run of consecutive blocks (interleaved pipeline schedules
// give a rank several).
type Chunk struct {
	Blocks []*Block
}

// First is the index of the chunk's first block.
func (c *Chunk) First() int { return c.Blocks[0].Index }

// Forward runs the chunk's blocks on x [B, T, C].
func (c *Chunk) Forward(x *tensor.Tensor, p Pass) (*tensor.Tensor, error) {
	var err error
	for _, b := range c.Blocks {
		if x, err = b.Forward(x, p); err != nil {
			return nil, err
		}
	}
	return x, nil
}

// Embed is the input stage: wte and wpe through its embedding layer.
type Embed struct {
	*Module
	Wte, Wpe *tensor.Tensor
	Layer    Layer // TokenPosEmbedding unless a plugin replaced it
}

// Block is one transformer block, pre-LayerNorm. Its LayerNorm weights are
// plain fields (every strategy keeps them whole); its LayerNorms, linear
// layers and attention core are Layers a strategy may replace (sequence
// parallel runs the LayerNorms on part of the sequence and sums their
// weights' gradients over its group).
type Block struct {
	*Module
	Index                  int
	Ln1W, Ln1B, Ln2W, Ln2B *tensor.Tensor
	Norm1, Norm2           Layer // ln_1, ln_2: LayerNorm over Ln1W/Ln1B, Ln2W/Ln2B
	Attn                   Layer // c_attn: [B,T,C] -> fused q|k|v [B,T,3C]
	Core                   Layer // attention core: q|k|v -> [B,T,C]
	AttnProj               Layer // attn.c_proj
	Fc                     Layer // mlp.c_fc
	MlpProj                Layer // mlp.c_proj
	MoE                    *MoE  // the MLP's replacement in a MoE block (Fc, MlpProj nil)
	// Act is the MLP's activation between Fc and MlpProj: nil for
	// GPT-2's GELU; Llama's SwiGLU gate (tensor.SiluMul of gate|up).
	Act func(*tensor.Tensor) *tensor.Tensor
	// Recompute is what the block's backward forms again (none by
	// default); see GPT.SetRecompute.
	Recompute Recompute
}

// Head is the output stage: ln_f, then the head and loss layer.
type Head struct {
	*Module
	LnW, LnB *tensor.Tensor
	Norm     Layer // ln_f: LayerNorm over LnW/LnB unless a plugin replaced it
	// Wte is the tied token embedding the logits are computed against: the
	// same tensor as Embed.Wte when this model holds both stages, else
	// this stage's own copy (registered as a parameter of the head).
	Wte *tensor.Tensor
	Out HeadLoss // TiedHead unless a plugin replaced it
}

// NewGPT builds the whole model with GPT-2 initialisation (see initOf):
// weights normal(0, 0.02), the residual projections scaled by
// 1/sqrt(2·n_layer), biases zero, LayerNorm weights one. Each parameter's
// numbers depend only on (seed, name, element index). Parameters come
// from alloc (nil = tensor.Default), and so do the activations computed
// from them.
func NewGPT(cfg GPTConfig, seed int64, dtype tensor.DType, alloc *tensor.Allocator) (*GPT, error) {
	return NewStage(cfg, seed, dtype, alloc, [][2]int{{0, cfg.NLayer}})
}

// NewStage builds the part of the model made of the given block ranges
// [lo, hi), ascending and disjoint: the embedding comes with the range
// that starts at block 0, the final LayerNorm and head with the one that
// ends at the last block. Its parameters equal the whole model's of the
// same names.
func NewStage(cfg GPTConfig, seed int64, dtype tensor.DType, alloc *tensor.Allocator, ranges [][2]int) (*GPT, error) {
	m, err := DescribeStage(cfg, dtype, alloc, ranges)
	if err != nil {
		return nil, err
	}
	for _, p := range m.Params() {
		p.Allocate()
		cfg.InitPart(seed, p.Spec, place.Single, p)
	}
	return m, nil
}

// Describe is the whole model without storage: every parameter has its
// name, global shape and placement (replicated) but no elements. A
// trainer describes the model first, lets the plugins say where each
// parameter lives, then gives each rank storage for its own parts only
// and fills them (InitPart, or a file's byte ranges).
func Describe(cfg GPTConfig, dtype tensor.DType, alloc *tensor.Allocator) (*GPT, error) {
	return DescribeStage(cfg, dtype, alloc, [][2]int{{0, cfg.NLayer}})
}

// DescribeStage is NewStage without storage (see Describe).
func DescribeStage(cfg GPTConfig, dtype tensor.DType, alloc *tensor.Allocator, ranges [][2]int) (*GPT, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Llama != nil {
		return describeLlamaStage(cfg, dtype, alloc, ranges)
	}
	if err := checkRanges(cfg, ranges); err != nil {
		return nil, err
	}
	C := cfg.NEmbd
	m := &GPT{Config: cfg}
	if alloc == nil {
		alloc = tensor.Default
	}
	newP := func(mod *Module, local string, shape ...int) *tensor.Tensor {
		p := mod.AddParam(local, alloc.NewShell(tensor.Params, dtype, shape...))
		if !cfg.Frozen(p.Name) { // lora.go
			p.RequiresGrad()
		}
		return p
	}
	if ranges[0][0] == 0 {
		e := &Embed{Module: NewModule("embed", "")}
		e.Wte = newP(e.Module, "wte.weight", cfg.VocabSize, C)
		e.Wpe = newP(e.Module, "wpe.weight", cfg.BlockSize, C)
		e.Layer = &TokenPosEmbedding{Wte: e.Wte, Wpe: e.Wpe}
		m.Embed = e
	}
	for _, r := range ranges {
		c := &Chunk{}
		for i := r[0]; i < r[1]; i++ {
			name := fmt.Sprintf("h.%d", i)
			b := &Block{Module: NewModule(name, name), Index: i}
			b.Ln1W = newP(b.Module, "ln_1.weight", C)
			b.Ln1B = newP(b.Module, "ln_1.bias", C)
			attnW := newP(b.Module, "attn.c_attn.weight", C, 3*C)
			attnB := newP(b.Module, "attn.c_attn.bias", 3*C)
			projW := newP(b.Module, "attn.c_proj.weight", C, C)
			projB := newP(b.Module, "attn.c_proj.bias", C)
			b.Ln2W = newP(b.Module, "ln_2.weight", C)
			b.Ln2B = newP(b.Module, "ln_2.bias", C)
			b.Attn, b.AttnProj = &Dense{attnW, attnB}, &Dense{projW, projB}
			if cfg.MoE.IsMoE(i) {
				b.MoE = newMoE(cfg.MoE, func(local string, shape ...int) *tensor.Tensor { return newP(b.Module, local, shape...) }, C)
			} else {
				fcW := newP(b.Module, "mlp.c_fc.weight", C, 4*C)
				fcB := newP(b.Module, "mlp.c_fc.bias", 4*C)
				mlpW := newP(b.Module, "mlp.c_proj.weight", 4*C, C)
				mlpB := newP(b.Module, "mlp.c_proj.bias", C)
				b.Fc, b.MlpProj = &Dense{fcW, fcB}, &Dense{mlpW, mlpB}
			}
			b.Core = &CausalAttention{NHead: cfg.NHead}
			b.Norm1, b.Norm2 = &LayerNorm{W: b.Ln1W, B: b.Ln1B}, &LayerNorm{W: b.Ln2W, B: b.Ln2B}
			cfg.addAdapters(b, func(local string, shape ...int) *tensor.Tensor { return newP(b.Module, local, shape...) })
			c.Blocks = append(c.Blocks, b)
		}
		m.Chunks = append(m.Chunks, c)
	}
	if ranges[len(ranges)-1][1] == cfg.NLayer {
		h := &Head{Module: NewModule("head", "")}
		h.LnW = newP(h.Module, "ln_f.weight", C)
		h.LnB = newP(h.Module, "ln_f.bias", C)
		h.Norm = &LayerNorm{W: h.LnW, B: h.LnB}
		if m.Embed != nil {
			h.Wte = m.Embed.Wte
		} else {
			// The last stage keeps its own copy of the tied table; it
			// starts equal to the first stage's (same seed and name).
			h.Wte = newP(h.Module, "wte.weight", cfg.VocabSize, C)
		}
		h.Out = &TiedHead{Wte: h.Wte}
		m.Head = h
	}
	return m, nil
}

// checkRanges reports block ranges a stage cannot be built from.
func checkRanges(cfg GPTConfig, ranges [][2]int) error {
	if len(ranges) == 0 {
		return fmt.Errorf("nn: a stage needs at least one range of blocks")
	}
	for i, r := range ranges {
		if r[0] < 0 || r[1] > cfg.NLayer || r[0] >= r[1] || (i > 0 && r[0] < ranges[i-1][1]) {
			return fmt.Errorf("nn: block ranges %v are not ascending, disjoint and inside [0, %d)", ranges, cfg.NLayer)
		}
	}
	return nil
}

// TiedTable is the name of the token table the head's logits are computed
// against when it is also the embedding (GPT-2's wte, a tied Llama's
// embed_tokens), or "" when the head has its own (an untied lm_head). A
// pipeline's first and last stage both hold a tied table and sum its
// gradient.
func (c GPTConfig) TiedTable() string {
	switch {
	case c.Llama == nil:
		return "wte.weight"
	case c.Llama.Tied:
		return LlamaEmbedName
	}
	return ""
}

// Whole reports whether the model holds every block and both stages.
func (m *GPT) Whole() bool {
	return m.Embed != nil && m.Head != nil && len(m.Blocks()) == m.Config.NLayer
}

// Blocks lists the blocks of every chunk, in model order.
func (m *GPT) Blocks() []*Block {
	var out []*Block
	for _, c := range m.Chunks {
		out = append(out, c.Blocks...)
	}
	return out
}

// Modules lists the units in forward order: embed, blocks, head (those
// this model holds).
func (m *GPT) Modules() []*Module {
	var out []*Module
	if m.Embed != nil {
		out = append(out, m.Embed.Module)
	}
	for _, b := range m.Blocks() {
		out = append(out, b.Module)
	}
	if m.Head != nil {
		out = append(out, m.Head.Module)
	}
	return out
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

// Forward of the input stage: embeddings of token ids idx [B, T].
func (e *Embed) Forward(idx *tensor.Tensor, p Pass) (*tensor.Tensor, error) {
	return e.Run(idx, p.Info, func(idx *tensor.Tensor) (*tensor.Tensor, error) { return e.Layer.Forward(idx, p) })
}

// Recompute says which of a block's activations its backward forms again
// instead of keeping them from the forward (the recompute.* keys).
type Recompute struct {
	// Full keeps only the block's input: the backward runs the whole
	// block's forward again (its collectives and module hooks included)
	// and then its backward.
	Full bool
	// Selective drops these outputs after the forward and forms them again
	// from what the backward keeps anyway, without a matrix product: the
	// LayerNorms' outputs (from their inputs), GELU's output (from its
	// input, the MLP's hidden layer, which is kept) and the attention
	// core's output (from q|k|v). A layer a strategy replaced by one that
	// cannot form its output again without communication (ring
	// attention) keeps it; sequence parallel's LayerNorm forms its part
	// of the sequence again.
	Norm, MlpAct, AttnCore bool
}

// SetRecompute gives the first n blocks this model holds (all for n = 0)
// recomputation r and the others none; n counts only under r.Full, where
// it trades memory for time block by block.
func (m *GPT) SetRecompute(r Recompute, n int) {
	for i, b := range m.Blocks() {
		b.Recompute = r
		if r.Full && n > 0 && i >= n {
			b.Recompute = Recompute{}
		}
	}
}

// Forward of one block on x [B, T, C].
func (b *Block) Forward(x *tensor.Tensor, p Pass) (*tensor.Tensor, error) {
	if !b.Recompute.Full {
		return b.forward(x, p)
	}
	y, err := tensor.Checkpoint(b.Name(), x, func(x *tensor.Tensor, rerun bool) (*tensor.Tensor, error) {
		q := p
		q.Info.Recompute = rerun
		return b.forward(x, q)
	})
	if err == nil {
		tensor.StoreHalf(y, x) // the kept input, under mixed precision
	}
	return y, err
}

// forward runs the block. The projections' outputs go as soon as the
// residual Adds have read them: neither the Add's backward nor a Linear's
// reads them (tensor.Discard; a strategy's projection that ends in a
// collective keeps its output). Under mixed precision what the block
// keeps for its backward, its input included, is stored in the compute
// dtype part by part, as soon as the forward is done with it
// (tensor.StoreHalf): the attention's part after the first residual
// Add, the MLP's hidden layer once activated, the rest at the end.
func (b *Block) forward(x *tensor.Tensor, p Pass) (*tensor.Tensor, error) {
	return b.Run(x, p.Info, func(x *tensor.Tensor) (*tensor.Tensor, error) {
		in := x
		var drop []*tensor.Tensor // dropped once the forward has read them (selective)
		keep := func(on bool, t *tensor.Tensor) *tensor.Tensor {
			if on {
				drop = append(drop, t)
			}
			return t
		}
		r := b.Recompute
		// settle gives back what selective recomputation drops and, under
		// mixed precision, stores in 2 bytes what the backward reads, from
		// to's graph down to from (included, to not): a part of the block
		// the forward has no more use for. A fully recomputed block keeps
		// nothing of its own. A MoE layer's buffers are stored with the
		// rest of the block at its end but for the router's probabilities
		// and weights, which their ops keep float32 (tensor.SoftmaxRows).
		settle := func(to, from *tensor.Tensor) {
			for _, t := range drop {
				tensor.Drop(t)
			}
			drop = drop[:0]
			if !r.Full {
				tensor.StoreHalf(to, from)
			}
		}
		// the ops write their 2-byte copies as they go (tensor.StoringHalf)
		// where the block stores its part soon after: not in a fully
		// recomputed block, which stores none, nor in a MoE layer, whose
		// buffers are stored at the block's end, so copies made as they go
		// would sit beside their float32 values through all its experts
		var storing func()
		if !r.Full {
			storing = tensor.StoringHalf(x)
		}
		defer func() {
			if storing != nil {
				storing()
			}
		}()
		h, err := b.Norm1.Forward(x, p)
		if err == nil {
			h, err = b.Attn.Forward(keep(r.Norm, h), p)
		}
		if err == nil {
			tensor.RoundHalf(h) // q|k|v as the backward reads them
			h, err = b.Core.Forward(h, p)
		}
		if err == nil {
			h, err = b.AttnProj.Forward(keep(r.AttnCore, h), p)
		}
		if err != nil {
			return nil, fmt.Errorf("%s attention: %w", b.Name(), err)
		}
		x = tensor.Add(x, h)
		tensor.Discard(h)
		settle(h, in) // the attention's part, the block's input with it
		mid := x
		if b.MoE != nil && storing != nil {
			storing()
			storing = nil
		}
		h, err = b.Norm2.Forward(x, p)
		switch {
		case err == nil && b.MoE != nil:
			h, err = b.MoE.Forward(keep(r.Norm, h), p)
		case err == nil:
			act := tensor.Gelu
			if b.Act != nil {
				act = b.Act
			}
			n2 := keep(r.Norm, h)
			if h, err = b.Fc.Forward(n2, p); err == nil {
				a := act(h)
				settle(a, n2) // the MLP's hidden layer and its input
				h, err = b.MlpProj.Forward(keep(r.MlpAct, a), p)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%s mlp: %w", b.Name(), err)
		}
		out := tensor.Add(x, h)
		tensor.Discard(h)
		settle(out, mid)
		return out, nil
	})
}

// Logits of the output stage: [B, T, V] from the last block's output.
func (h *Head) Logits(x *tensor.Tensor, p Pass) (*tensor.Tensor, error) {
	return h.Run(x, p.Info, func(x *tensor.Tensor) (*tensor.Tensor, error) {
		x, err := h.Norm.Forward(x, p)
		if err != nil {
			return nil, err
		}
		return h.Out.Logits(x, p)
	})
}

// Loss of the output stage: mean cross-entropy of predicting targets
// [B, T] from the last block's output.
func (h *Head) Loss(x, targets *tensor.Tensor, p Pass) (*tensor.Tensor, error) {
	return h.Run(x, p.Info, func(x *tensor.Tensor) (*tensor.Tensor, error) {
		x, err := h.Norm.Forward(x, p)
		if err != nil {
			return nil, err
		}
		return h.Out.Loss(x, targets, p)
	})
}

// body runs the embedding and every chunk on idx [B, T]; the model must be
// whole.
func (m *GPT) body(idx *tensor.Tensor, p Pass) (*tensor.Tensor, error) {
	if !m.Whole() {
		return nil, fmt.Errorf("nn: this model holds part of the GPT (a pipeline stage); run its stages through the pipeline")
	}
	if t := idx.Dim(-1); t > m.Config.BlockSize {
		return nil, fmt.Errorf("nn: sequence of %d tokens exceeds block_size %d", t, m.Config.BlockSize)
	}
	x, err := m.Embed.Forward(idx, p)
	for _, c := range m.Chunks {
		if err != nil {
			return nil, err
		}
		x, err = c.Forward(x, p)
	}
	return x, err
}

// Logits runs the whole model on idx [B, T].
func (m *GPT) Logits(idx *tensor.Tensor, p Pass) (*tensor.Tensor, error) {
	x, err := m.body(idx, p)
	if err != nil {
		return nil, err
	}
	return m.Head.Logits(x, p)
}

// Loss returns the mean cross-entropy of the whole model's predictions of
// targets [B, T] from idx [B, T].
func (m *GPT) Loss(idx, targets *tensor.Tensor, p Pass) (*tensor.Tensor, error) {
	x, err := m.body(idx, p)
	if err != nil {
		return nil, err
	}
	return m.Head.Loss(x, targets, p)
}

// ParamShape is a global parameter's name and shape.
type ParamShape struct {
	Name  string
	Shape []int
}

// ParamShapes lists every global parameter of the model of shape c (the
// tied wte once), in forward order, without building it.
func (c GPTConfig) ParamShapes() []ParamShape {
	if c.Llama != nil {
		return c.llamaShapes()
	}
	C := c.NEmbd
	out := []ParamShape{{"wte.weight", []int{c.VocabSize, C}}, {"wpe.weight", []int{c.BlockSize, C}}}
	for i := 0; i < c.NLayer; i++ {
		p := fmt.Sprintf("h.%d.", i)
		out = append(out,
			ParamShape{p + "ln_1.weight", []int{C}}, ParamShape{p + "ln_1.bias", []int{C}},
			ParamShape{p + "attn.c_attn.weight", []int{C, 3 * C}}, ParamShape{p + "attn.c_attn.bias", []int{3 * C}},
			ParamShape{p + "attn.c_proj.weight", []int{C, C}}, ParamShape{p + "attn.c_proj.bias", []int{C}},
			ParamShape{p + "ln_2.weight", []int{C}}, ParamShape{p + "ln_2.bias", []int{C}})
		if c.MoE.IsMoE(i) {
			out = append(out, c.MoE.paramShapes(p, C)...)
			continue
		}
		out = append(out,
			ParamShape{p + "mlp.c_fc.weight", []int{C, 4 * C}}, ParamShape{p + "mlp.c_fc.bias", []int{4 * C}},
			ParamShape{p + "mlp.c_proj.weight", []int{4 * C, C}}, ParamShape{p + "mlp.c_proj.bias", []int{C}})
		out = append(out, c.loraShapes(p[:len(p)-1])...) // lora.go
	}
	return append(out, ParamShape{"ln_f.weight", []int{C}}, ParamShape{"ln_f.bias", []int{C}})
}
