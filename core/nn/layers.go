package nn

import (
	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// Pass is what a layer's forward is told about the run: which micro-batch
// of the step it is, and where the rows of its input sit in the sequence.
type Pass struct {
	Info tensor.PassInfo
	// Pos are the global positions of the T sequence rows this rank
	// computes, ascending; nil means 0..T-1 (the whole sequence). Context
	// parallel ranks hold parts of the sequence: position embeddings and
	// the causal mask follow these positions, not row indices.
	Pos []int
}

// Layer is a piece of the model a strategy may replace in Prepare: a
// Linear (tensor parallel swaps in column- and row-parallel layers), the
// attention core (context parallel swaps in ring attention) or the
// embedding (vocabulary-parallel lookup). Forward returns an error so that
// a collective inside a layer fails the step cleanly instead of panicking.
// Sequence parallel also replaces the LayerNorms (nn.LayerNorm), which then
// see part of the sequence.
type Layer interface {
	Forward(x *tensor.Tensor, p Pass) (*tensor.Tensor, error)
}

// HeadLoss is the output projection and the loss, replaced together:
// vocabulary-parallel cross-entropy never builds the full logits.
type HeadLoss interface {
	// Logits returns the full logits [B, T, V] (evaluation, sampling).
	Logits(x *tensor.Tensor, p Pass) (*tensor.Tensor, error)
	// Loss returns the mean cross-entropy over the non-ignored targets.
	Loss(x, targets *tensor.Tensor, p Pass) (*tensor.Tensor, error)
}

// Dense is the plain Linear: x·W + B, W in the Hugging Face GPT-2 Conv1D
// layout [in, out], B [out] or nil. Bias is the layer's business: a
// row-parallel replacement adds it once, after summing the partial
// products.
type Dense struct {
	W, B *tensor.Tensor
}

// Forward implements Layer.
func (d *Dense) Forward(x *tensor.Tensor, _ Pass) (*tensor.Tensor, error) {
	return tensor.Linear(x, d.W, d.B), nil
}

// LayerNorm is GPT-2's LayerNorm over the last dimension with weight W and
// bias B (epsilon LayerNormEps).
type LayerNorm struct {
	W, B *tensor.Tensor
}

// Forward implements Layer.
func (l *LayerNorm) Forward(x *tensor.Tensor, _ Pass) (*tensor.Tensor, error) {
	return tensor.LayerNorm(x, l.W, l.B, LayerNormEps), nil
}

// CausalAttention is the attention core: multi-head causal attention of a
// fused q|k|v input [B, T, 3C] (c_attn's output) among the rows it is
// given, masked by their global positions (a row sees the rows at its
// position or before). A rank that holds only part of a sequence needs the
// other parts' keys too: context parallel replaces this layer.
//
// Llama's core (NKVHead > 0) reads the fused layout of its q|k|v
// projections, NHead query heads then NKVHead key and value heads (GPT-2's
// with NKVHead = NHead), turns q and k by their global positions (RoPE,
// base RopeTheta) and runs grouped-query attention.
type CausalAttention struct {
	NHead     int
	NKVHead   int     // Llama only: key/value heads
	RopeTheta float64 // Llama only: rotary base
}

// Forward implements Layer.
func (a *CausalAttention) Forward(qkv *tensor.Tensor, p Pass) (*tensor.Tensor, error) {
	if a.NKVHead > 0 {
		qkv = tensor.RoPE(qkv, a.NHead, a.NKVHead, p.Pos, a.RopeTheta)
		return tensor.GroupedAttention(qkv, a.NHead, a.NKVHead, p.Pos), nil
	}
	if p.Pos == nil {
		return tensor.CausalSelfAttention(qkv, a.NHead), nil
	}
	out, lse := tensor.SelfAttention(qkv, a.NHead, p.Pos)
	lse.Release()
	return out, nil
}

// TokenPosEmbedding is the input layer: token embedding plus position
// embedding at the rows' global positions.
type TokenPosEmbedding struct {
	Wte, Wpe *tensor.Tensor
}

// Forward implements Layer on token ids idx [B, T].
func (e *TokenPosEmbedding) Forward(idx *tensor.Tensor, p Pass) (*tensor.Tensor, error) {
	return tensor.AddPositions(tensor.Embedding(e.Wte, idx), e.Wpe, p.Pos), nil
}

// TiedHead is the output layer of GPT-2: logits against the token
// embedding table [V, C], then cross-entropy.
type TiedHead struct {
	Wte *tensor.Tensor
}

// Logits implements HeadLoss.
func (h *TiedHead) Logits(x *tensor.Tensor, _ Pass) (*tensor.Tensor, error) {
	return tensor.MatMulT(x, h.Wte), nil
}

// Loss implements HeadLoss.
func (h *TiedHead) Loss(x, targets *tensor.Tensor, p Pass) (*tensor.Tensor, error) {
	logits, err := h.Logits(x, p)
	if err != nil {
		return nil, err
	}
	return tensor.CrossEntropy(logits, targets), nil
}

// QKVShard is the placement of c_attn's weight (dim 1) or bias (dim 0)
// when a rank holds heads [h0, h1) of nHead over width C: the fused
// columns are three blocks [q | k | v] of C, and the rank holds the same
// head columns of each.
func QKVShard(dim, C, nHead, h0, h1 int) place.Placement {
	hs := C / nHead
	return place.Placement{Kind: place.Shard, Dim: dim, Blocks: 3, Offset: h0 * hs, Length: (h1 - h0) * hs}
}

// QKVColumns are the column ranges [lo, hi) of the q, k and v parts of
// heads [h0, h1) in a fused [.., 3C] tensor.
func QKVColumns(C, nHead, h0, h1 int) [3][2]int {
	hs := C / nHead
	var out [3][2]int
	for i := range out {
		out[i] = [2]int{i*C + h0*hs, i*C + h1*hs}
	}
	return out
}
