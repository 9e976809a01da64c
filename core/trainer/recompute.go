package trainer

import (
	"slices"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/nn"
)

// RecomputeOf is the block recomputation recompute.granularity and
// recompute.modules ask for.
func RecomputeOf(cfg config.Config) nn.Recompute {
	r := cfg.Recompute
	switch r.Granularity {
	case "full":
		return nn.Recompute{Full: true}
	case "selective":
		return nn.Recompute{Norm: slices.Contains(r.Modules, "norm"), MlpAct: slices.Contains(r.Modules, "mlp_act"),
			AttnCore: slices.Contains(r.Modules, "attn_core")}
	}
	return nn.Recompute{}
}

// RecomputedBlocks is how many blocks of a stage of L blocks run their
// forward again under recompute.granularity=full (recompute.blocks, 0 =
// all), 0 for the other granularities.
func RecomputedBlocks(cfg config.Config, L int) int {
	if cfg.Recompute.Granularity != "full" {
		return 0
	}
	if n := cfg.Recompute.Blocks; n > 0 {
		return min(n, L)
	}
	return L
}

// ActLayout is how a rank holds a micro-batch's activations: what the
// estimates of the layouts change in the one-process count.
type ActLayout struct {
	TP   int  // tensor-parallel degree: the head- and MLP-internal buffers divide by it
	SP   bool // sequence parallel: the LayerNorms and the residual stream hold 1/TP of the sequence
	Ring bool // ring attention: the core keeps its output (no refill)
	CP   bool // context parallel: the attention is cp's, storing its output under mixed precision
	// Deferred: weight gradients wait for a W pass (zb1), so the
	// backward frees nothing until it.
	Deferred bool
}

// BlockActs are one block's activation floats for one micro-batch of B
// sequences of T positions (docs/formulas.md, "Activation recomputation").
type BlockActs struct {
	// Saved is what the forward keeps for the backward: (whole + split/n)
	// per position (GPT-2: 18·C, ActWidths) less the two projections'
	// outputs where they are plain Linears (16·C), the attention's
	// log-sum-exp (H/n per position) and the LayerNorms' statistics (4
	// per position).
	Saved int64
	// Drop is what selective recomputation takes off Saved: 2·C for the
	// LayerNorms' outputs (norm), the MLP's activation output, FFN/n
	// (mlp_act), the attention output, C/n (attn_core), per position.
	Drop int64
	// Out is what a fully recomputed block keeps: its output, C per
	// position.
	Out int64
	// Work is the most one op backward of the block holds beside the
	// saved tensors: at the MLP's c_proj, the gradient of its input
	// (FFN/n), and in one process the residual Add's copy of its
	// gradient (C), per position; Bump is what
	// selective recomputation adds there, the MLP's activation formed
	// again (FFN/n under mlp_act).
	Work, Bump int64
	// Held is what a backward that defers its weight gradients keeps of
	// the block until its W: the saved tensors and every gradient formed,
	// 2·(whole + split/n) per position and the log-sum-exp.
	Held int64
	// Exact is the part of Saved that stays float32 under mixed
	// precision: the log-sum-exp and the norms' statistics, H/n + 4 per
	// position, and the output of the whole-sequence attention, whose
	// backward reads it beside its log-sum-exp (C/n; context parallel's
	// attention stores its own); DropExact is the part of Drop among it
	// (attn_core).
	Exact, DropExact int64
	// Widened is what the backward holds at the MLP activation's
	// backward beyond float32's count where the block's activations are
	// stored in 2 bytes: FFN/n per position. GELU's backward reads its
	// input as stored, widening it a piece at a time in cache, and
	// c_proj's weight gradient read GELU's output as stored
	// (tensor.halfReads), so neither is widened whole; but that output
	// goes back before GELU's backward, beside the gradients of both,
	// and gives back its 2 bytes an element where float32's count has it
	// give back 4. Under mlp_act the output is formed again in float32
	// (Bump) and goes as in float32, and its input is widened whole to
	// form it: FFN/n again.
	Widened int64
}

// BlockActsOf counts one block's activations under recomputation r for
// micro-batch B in layout l.
func BlockActsOf(m nn.GPTConfig, r nn.Recompute, B int, l ActLayout) BlockActs {
	b, t, c, h, n := int64(B), int64(m.BlockSize), int64(m.NEmbd), int64(m.NHead), int64(max(1, l.TP))
	bt, ffn := b*t, int64(m.FFN())
	whole, split := m.ActWidths() // GPT-2: 6·C and 12·C; a Llama's in nn
	a := BlockActs{Out: bt * c, Work: ffn / n * bt, Widened: ffn / n * bt, Exact: bt*h/n + 4*bt}
	a.Saved = (whole+split/n)*bt + a.Exact
	exactAttn := !l.CP
	if exactAttn {
		a.Exact += c / n * bt
	}
	a.Held = (2*whole+2*split/n)*bt + bt*h/n
	if n == 1 {
		a.Work += c * bt // the residual Add's copy of its gradient for the projection
	}
	if l.SP {
		// The residual stream holds 1/n of the sequence: the block's
		// output, and its input and middle residual among the saved.
		a.Out /= n
		a.Saved -= 2 * c * bt * (n - 1) / n
	}
	if n == 1 {
		// The projections' outputs go once the residual Adds read them
		// (nn.Block.forward); a tensor-parallel projection ends in a
		// collective and keeps its output, and so does a MoE layer.
		a.Saved -= c * bt
		a.Held -= c * bt
		if m.MoE.Experts == 0 {
			a.Saved -= c * bt
			a.Held -= c * bt
		}
	}
	if r.Norm {
		a.Drop += 2 * c * bt
		if l.SP {
			a.Drop /= n // sequence parallel's LayerNorms hold 1/n of the sequence
		}
	}
	if r.MlpAct {
		a.Drop += ffn / n * bt
		a.Bump = ffn / n * bt
	}
	if r.AttnCore && !l.Ring {
		a.Drop += c / n * bt
		if exactAttn {
			a.DropExact = c / n * bt
		}
	}
	return a
}

// PassActs is one micro-batch's pass through a run of L blocks, the
// first K of them fully recomputed (K = 0 otherwise), between what comes
// before (Pre: the embeddings' outputs, or a received input) and after
// (Head: what the output stage keeps for its backward; Grad: the
// gradient its backward starts from, the logits' or a received one).
// The terms are floats; Saved and Peak are bytes, with E the bytes of a
// block's activation kept for the backward: 4, or 2 under mixed
// precision, which stores them in the compute dtype (tensor.StoreHalf).
// Everything else is float32: the statistics, what comes before and
// after the blocks, every gradient, a recomputed block's rerun.
type PassActs struct {
	Block        BlockActs
	L, K         int
	Selective    bool
	Pre          int64
	Head, Grad   int64
	HeldHead     int64 // the output stage's terms held until a deferred W
	DeferredPass bool
	E            int64
	// HeadHalf is the part of Head stored at E bytes: the logits under
	// mixed precision (tensor.CrossEntropy), which the backward reads as
	// stored, widening them into their gradient's buffer; a deferred
	// pass holds them so until its W, beside HeldHead.
	HeadHalf int64
}

// PassActsE is the bytes of a block's activation kept for the backward
// under train.mixed_precision mp: 2 in bf16 and fp16, 4 otherwise.
func PassActsE(mp string) int64 {
	if mp == "bf16" || mp == "fp16" {
		return 2
	}
	return 4
}

// kept is the bytes a block not fully recomputed keeps for its backward.
func (p PassActs) kept() int64 {
	a := p.Block
	exact, f := a.Exact, a.Saved-a.Exact
	if p.Selective {
		f -= a.Drop - a.DropExact
		exact -= a.DropExact
	}
	return p.E*f + 4*exact
}

// Saved is the bytes the pass keeps from its forward to its backward.
func (p PassActs) Saved() int64 {
	return 4*p.Pre + int64(p.L-p.K)*p.kept() + int64(p.K)*p.E*p.Block.Out + p.headBytes()
}

// headBytes is what the output stage keeps for its backward, in bytes.
func (p PassActs) headBytes() int64 { return 4*(p.Head-p.HeadHalf) + p.E*p.HeadHalf }

// Peak is the most the pass holds at once, in its backward. Freeing as
// it goes, the backward holds the saved tensors less those already
// passed, and the peak is either the output stage's first op (Head and
// Grad beside everything saved) or the last block's MLP (Work beside
// the saved tensors, the head gone), whichever is larger; a fully
// recomputed last block rebuilds its saved tensors there beside the
// output it kept. A deferred backward frees nothing until its W: every
// block holds Held (a recomputed one's rerun graph stays for W, beside
// the output it kept), and selective refills stay; what was stored in 2
// bytes is float32 again by then, but for the logits (HeadHalf), which
// the loss's backward reads as stored. Stored in 2 bytes, the last block's
// MLP also holds what it widened (Widened), unless the block is
// recomputed, whose rerun stores nothing.
func (p PassActs) Peak() int64 {
	a := p.Block
	if p.DeferredPass {
		return 4*(p.Pre+p.HeldHead+int64(p.L)*a.Held+int64(p.K)*a.Out) + p.E*p.HeadHalf
	}
	return max(p.HeadMoment(), p.BlockMoment(p.L))
}

// HeadMoment is what the pass holds at the output stage's first backward
// op, in bytes: everything saved (the logits as stored: the loss's
// backward reads them so) and the gradient the backward starts from.
func (p PassActs) HeadMoment() int64 { return p.Saved() + 4*p.Grad }

// BlockMoment is what the pass holds during the backward of its block j
// (1 the first, L the last; 0: none, only what comes before), in bytes:
// the output stage and the blocks after j are freed, the saved tensors of
// blocks 1 to j are held, beside one op's working buffers (the MLP's,
// and what it widened from 2 bytes); a fully recomputed block (the first
// K) rebuilds its saved tensors there, in float32, beside the output it
// kept. A strategy that holds other buffers at each of these moments
// (ZeRO's gathered units) takes the largest sum.
func (p PassActs) BlockMoment(j int) int64 {
	a := p.Block
	work := 4 * a.Work
	if p.Selective {
		work += 4 * a.Bump
	}
	recomputed := min(j, p.K)
	switch {
	case j >= 1 && j <= p.K:
		work += 4 * a.Saved
	case j >= 1:
		work += (4 - p.E) * a.Widened
	}
	return 4*p.Pre + int64(recomputed)*p.E*a.Out + int64(j-recomputed)*p.kept() + work
}

// RecomputeFLOPsPerToken is the compute full recomputation adds to a
// token's training cost: one more forward of each recomputed block, 2·12·C²
// for its matrix products and 2·C·T for its attention (per token, as
// nn.GPTConfig.FLOPsPerToken counts). Selective recomputation repeats no
// matrix product.
func RecomputeFLOPsPerToken(cfg config.Config) float64 {
	m := GPTConfig(cfg)
	k, c, t := float64(RecomputedBlocks(cfg, m.NLayer)), float64(m.NEmbd), float64(m.BlockSize)
	return k * (24*c*c + 2*c*t)
}
