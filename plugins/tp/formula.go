package tp

import "github.com/tinyacc/tinyacc/core/nn"

// StepBytes is what one rank of a tensor-parallel group of n sends over the
// group in one optimizer step of accum micro-batches of b sequences (its
// data-parallel slice; s = c.BlockSize tokens each), with activations of
// e bytes (4 in float32; 2 under mixed precision, whose activations and
// activation gradients travel in bf16/fp16; parameter gradients and the
// cross-entropy's statistics stay 4-byte floats), counted as bytes sent per rank with the ring factors of
// docs/formulas.md: 2(n-1)/n of the buffer for an all-reduce, (n-1)/n of
// the whole (gathered) buffer for an all-gather or a reduce-scatter. With
// L layers of width h and the per-micro-batch volume V = b·s·h:
//
// Plain tensor parallel, per micro-batch: each layer all-reduces V twice
// forward (after attn.c_proj and mlp.c_proj) and twice backward (the
// input gradients of attn.c_attn and mlp.c_fc); the embedding all-reduces
// V forward, the head's input gradient V backward; the cross-entropy
// all-reduces three numbers per token (the maximum, the sum of
// exponentials, the target's logit):
//
//	plain = accum · 2(n-1)/n · (e·(4L + 2)·V + 4·3·b·s)
//
// Sequence parallel moves the same activation volume as all-gathers and
// reduce-scatters (each layer: 4 forward, 4 backward; the embedding's
// reduce-scatter and its gradient's all-gather; the head's all-gather and
// its gradient's reduce-scatter), and also sums, in every micro-batch's
// backward, the partial gradients of the parameters used on part of the
// sequence: ln_1, ln_2 (2h each), the two row-parallel biases (h each) per
// layer, ln_f (2h) and the whole wpe (s·h):
//
//	sp = accum · ((n-1)/n · e · (8L + 4)·V + 2(n-1)/n · 4 · (3·b·s + (6L + 2)·h + s·h))
//
// The activation terms are equal: 2(n-1)/n·(4L+2) = (n-1)/n·(8L+4).
func StepBytes(c nn.GPTConfig, b, accum, n int, sp bool, e int) float64 {
	if n < 2 {
		return 0
	}
	N := float64(n)
	L, h, s, B := float64(c.NLayer), float64(c.NEmbd), float64(c.BlockSize), float64(b)
	V := B * s * h
	ar, ag := 2*(N-1)/N, (N-1)/N // all-reduce; all-gather and reduce-scatter
	if !sp {
		return float64(accum) * ar * (float64(e)*(4*L+2)*V + 4*3*B*s)
	}
	return float64(accum) * (ag*float64(e)*(8*L+4)*V + ar*4*(3*B*s+(6*L+2)*h+s*h))
}
