package tensor

import (
	"fmt"
	"slices"

	"github.com/tinyacc/tinyacc/core/tensor/cpu"
)

// Causal attention by global positions. Every query row and key row carries
// the position of its token in the whole sequence, and key j is visible to
// query i iff pos(j) <= pos(i). With positions, a rank that holds only some
// rows of a sequence (a contiguous chunk, or the two chunks of a zigzag
// split) computes exactly the rows of the whole sequence's attention that it
// holds, from its own keys and keys received from other ranks.
//
// Per head, with s_ij = q_i·k_j / sqrt(hs) over the visible keys:
//
//	lse_i = log Σ_j exp(s_ij),  out_i = Σ_j exp(s_ij - lse_i) v_j
//
// Attention over a union of key blocks A and B is exact to assemble from the
// attention over each, through the log-sum-exp (the online softmax):
//
//	lse = m + log(exp(lse_A - m) + exp(lse_B - m)),  m = max(lse_A, lse_B)
//	out = out_A exp(lse_A - lse) + out_B exp(lse_B - lse)
//
// and its backward needs, per block, only the final lse and delta_i =
// dout_i·out_i (see the cpu package's AttentionLSEBackward). Positions must
// be strictly ascending within each set of rows.

// SelfAttention is causal multi-head attention of a fused qkv [B, T, 3C]
// (GPT-2's c_attn output: q, k, v in column ranges [0,C), [C,2C), [2C,3C),
// head h using columns h*C/nHead..(h+1)*C/nHead of each) whose rows sit at
// global positions pos (len T, strictly ascending; nil means 0..T-1). It
// returns out [B, T, C], recorded for autograd, and lse [B, NH, T], the
// per-row log-sum-exp of the scores (-Inf for a row that sees no key), which
// is not differentiable: no gradient flows into it. Both come from qkv's
// allocator; the caller releases lse.
func SelfAttention(qkv *Tensor, nHead int, pos []int) (out, lse *Tensor) {
	return selfAttention("SelfAttention", qkv, nHead, pos, true)
}

// CausalSelfAttention is SelfAttention at positions 0..T-1 without the
// log-sum-exp: multi-head causal attention of a fused [B, T, 3C] qkv,
// returning the heads concatenated, [B, T, C].
func CausalSelfAttention(qkv *Tensor, nHead int) *Tensor {
	out, _ := selfAttention("CausalSelfAttention", qkv, nHead, nil, false)
	return out
}

func selfAttention(op string, qkv *Tensor, nHead int, pos []int, wantLSE bool) (out, lse *Tensor) {
	checkFloat(op, qkv)
	if nHead < 1 || len(qkv.shape) != 3 || qkv.shape[2]%3 != 0 || (qkv.shape[2]/3)%nHead != 0 {
		panic(fmt.Sprintf("tensor: attention input %v does not split into q, k, v of %d heads", qkv.shape, nHead))
	}
	return attend(op, qkv, nHead, nHead, pos, wantLSE)
}

// attend is the attention of SelfAttention and GroupedAttention: nHead
// query heads over a fused q|k|v of nHead query then nKV key and value
// heads (nKV = nHead: GPT-2's [q | k | v]), at positions pos (nil:
// 0..T-1), returning the heads concatenated and, with wantLSE, the
// log-sum-exp for the caller.
func attend(op string, qkv *Tensor, nHead, nKV int, pos []int, wantLSE bool) (out, lse *Tensor) {
	B, T, W := qkv.shape[0], qkv.shape[1], qkv.shape[2]
	hs := W / (nHead + 2*nKV)
	if pos == nil {
		pos = make([]int, T)
		for i := range pos {
			pos[i] = i
		}
	} else {
		checkPositions(op, "pos", pos, T)
		pos = slices.Clone(pos) // the backward must see these, whatever the caller does later
	}
	d := cpu.AttnDims{B: B, NH: nHead, HS: hs, Tq: T, Tk: T, LdQ: W, LdK: W, LdV: W, LdO: nHead * hs, KVH: nKV,
		HalfProducts: HalfProducts(qkv)}
	out = like(qkv, B, T, nHead*hs)
	// The backward needs only out and the log-sum-exp: it recomputes the
	// probabilities from q, k and lse (the arithmetic of the context
	// parallel path), so no [T, T] buffer outlives the forward: what a
	// layer keeps grows with T, not T².
	var keep *Tensor // the log-sum-exp kept for the backward
	if wantLSE || qkv.requiresGrad {
		keep = like(qkv, B, nHead, T)
	}
	if qkv.dtype == Float32 {
		selfAttentionForward[float32](d, qkv, pos, out, keep)
	} else {
		selfAttentionForward[float64](d, qkv, pos, out, keep)
	}
	if wantLSE {
		lse = keep
		if qkv.requiresGrad {
			// The caller releases lse; the backward keeps its own copy.
			keep = like(qkv, B, nHead, T)
			keep.CopyFrom(lse)
		}
	}
	if !qkv.requiresGrad {
		return out, lse
	}
	record(out, "attention", func(_ *Backprop, g *Tensor) []*Tensor {
		gq := like(qkv, qkv.shape...) // every element is written: no zero-fill
		if qkv.dtype == Float32 {
			selfAttentionBackward[float32](d, g, qkv, out, keep, pos, gq)
		} else {
			selfAttentionBackward[float64](d, g, qkv, out, keep, pos, gq)
		}
		return []*Tensor{gq}
	}, qkv)
	saveBuf(out, keep)
	out.node.exact = true
	setRefill(out, func(out *Tensor) {
		// The forward again, into a scratch log-sum-exp: bitwise the
		// dropped output (and the kept lse).
		l := like(qkv, B, nHead, T)
		if qkv.dtype == Float32 {
			selfAttentionForward[float32](d, qkv, pos, out, l)
		} else {
			selfAttentionForward[float64](d, qkv, pos, out, l)
		}
		l.Release()
	})
	return out, lse
}

func selfAttentionForward[F cpu.Float](d cpu.AttnDims, qkv *Tensor, pos []int, out, lse *Tensor) {
	x, kc, vc := data[F](qkv), d.NH*d.HS, (d.NH+d.KVH)*d.HS
	cpu.AttentionPosForward(d, x, x[kc:], x[vc:], pos, pos, data[F](out), nil, dataOrNil[F](lse))
}

// selfAttentionBackward recomputes the probabilities of each row block from
// q, k and lse and writes the gradient into gq (dq | dk | dv, which cover
// all its columns), whose contents it never reads.
func selfAttentionBackward[F cpu.Float](d cpu.AttnDims, g, qkv, out, lse *Tensor, pos []int, gq *Tensor) {
	x, dx, kc, vc := data[F](qkv), data[F](gq), d.NH*d.HS, (d.NH+d.KVH)*d.HS
	delta := like(qkv, lse.shape...)
	defer delta.Release()
	cpu.AttentionDelta(d, data[F](g), data[F](out), data[F](delta))
	cpu.AttentionLSEGrad(d, data[F](g), x, x[kc:], x[vc:], data[F](delta), data[F](lse), pos, pos, dx, dx[kc:], dx[vc:])
}

// HalfProducts is the format of the attention's matrix products on t's
// rank (cpu.AttnDims.HalfProducts): under mixed precision its compute
// dtype, as every matrix product's (precision.go); none otherwise. Every
// attention of a rank, context parallel's included, takes it from here.
func HalfProducts(t *Tensor) cpu.HalfFormat {
	switch computeOf(t) {
	case BFloat16:
		return cpu.BF16
	case Float16:
		return cpu.F16
	}
	return cpu.NoHalf
}

// dataOrNil is data for an optional tensor.
func dataOrNil[F cpu.Float](t *Tensor) []F {
	if t == nil {
		return nil
	}
	return data[F](t)
}

// checkPositions panics unless pos has n strictly ascending entries.
func checkPositions(op, name string, pos []int, n int) {
	if len(pos) != n {
		panic(fmt.Sprintf("tensor: %s has %d positions in %s for %d rows", op, len(pos), name, n))
	}
	for i := 1; i < len(pos); i++ {
		if pos[i] <= pos[i-1] {
			panic(fmt.Sprintf("tensor: %s needs strictly ascending positions, but %s has %d at index %d after %d",
				op, name, pos[i], i, pos[i-1]))
		}
	}
}

// KVBlock is one block of keys and values, [B, Tk, C] each, whose rows sit
// at global positions Pos (len Tk, strictly ascending).
type KVBlock struct {
	K, V *Tensor
	Pos  []int
}

// BlockAttention is causal multi-head attention of queries q [B, Tq, C] at
// global positions qpos over the union of several key/value blocks, heads of
// C/nHead columns. It is computed block by block and merged through the
// log-sum-exp (the arithmetic of ring attention, in one process), so the
// result is the attention over all the blocks' keys at once; the blocks may
// come in any order. The backward runs block by block from the final
// log-sum-exp. Gradients flow to q and to every block's K and V. The output
// comes from q's allocator.
func BlockAttention(q *Tensor, qpos []int, blocks []KVBlock, nHead int) *Tensor {
	ts := []*Tensor{q}
	for _, b := range blocks {
		ts = append(ts, b.K, b.V)
	}
	checkFloat("BlockAttention", ts...)
	if len(blocks) == 0 {
		panic("tensor: BlockAttention needs at least one key/value block")
	}
	if nHead < 1 || len(q.shape) != 3 || q.shape[2]%nHead != 0 {
		panic(fmt.Sprintf("tensor: BlockAttention query %v does not split into %d heads", q.shape, nHead))
	}
	B, Tq, C := q.shape[0], q.shape[1], q.shape[2]
	checkPositions("BlockAttention", "qpos", qpos, Tq)
	qpos = slices.Clone(qpos)
	blocks = slices.Clone(blocks)
	dims := make([]cpu.AttnDims, len(blocks))
	for n, b := range blocks {
		if len(b.K.shape) != 3 || b.K.shape[0] != B || b.K.shape[2] != C || !slices.Equal(b.K.shape, b.V.shape) {
			panic(fmt.Sprintf("tensor: BlockAttention block %d has keys %v and values %v for queries %v", n, b.K.shape, b.V.shape, q.shape))
		}
		checkPositions("BlockAttention", fmt.Sprintf("block %d", n), b.Pos, b.K.shape[1])
		blocks[n].Pos = slices.Clone(b.Pos)
		dims[n] = cpu.AttnDims{B: B, NH: nHead, HS: C / nHead, Tq: Tq, Tk: b.K.shape[1], LdQ: C, LdK: C, LdV: C, LdO: C,
			HalfProducts: HalfProducts(q)}
	}
	out := like(q, B, Tq, C)
	lse := like(q, B, nHead, Tq)
	if q.dtype == Float32 {
		blockAttentionForward[float32](dims, q, qpos, blocks, out, lse)
	} else {
		blockAttentionForward[float64](dims, q, qpos, blocks, out, lse)
	}
	record(out, "block_attention", func(_ *Backprop, g *Tensor) []*Tensor {
		grads := make([]*Tensor, len(ts))
		for i, t := range ts {
			grads[i] = zerosLike(t, t.shape...)
		}
		if q.dtype == Float32 {
			blockAttentionBackward[float32](dims, g, q, qpos, blocks, out, lse, grads)
		} else {
			blockAttentionBackward[float64](dims, g, q, qpos, blocks, out, lse, grads)
		}
		for i, t := range ts {
			if !t.requiresGrad { // computed alongside the others; nobody takes it
				grads[i].Release()
				grads[i] = nil
			}
		}
		return grads
	}, ts...)
	if out.node == nil {
		lse.Release()
	} else {
		saveBuf(out, lse)
	}
	return out
}

// blockAttentionForward writes into out and lse the attention over the
// first block and merges in each further block's.
func blockAttentionForward[F cpu.Float](dims []cpu.AttnDims, q *Tensor, qpos []int, blocks []KVBlock, out, lse *Tensor) {
	x := data[F](q)
	for n, b := range blocks {
		if n == 0 {
			cpu.AttentionPosForward(dims[n], x, data[F](b.K), data[F](b.V), qpos, b.Pos, data[F](out), nil, data[F](lse))
			continue
		}
		outB, lseB := like(q, out.shape...), like(q, lse.shape...)
		cpu.AttentionPosForward(dims[n], x, data[F](b.K), data[F](b.V), qpos, b.Pos, data[F](outB), nil, data[F](lseB))
		cpu.AttentionMerge(dims[n], data[F](out), data[F](lse), data[F](outB), data[F](lseB))
		outB.Release()
		lseB.Release()
	}
}

// blockAttentionBackward accumulates each block's share of the gradient:
// grads holds dq, then dK and dV of every block.
func blockAttentionBackward[F cpu.Float](dims []cpu.AttnDims, g, q *Tensor, qpos []int, blocks []KVBlock, out, lse *Tensor, grads []*Tensor) {
	delta := like(q, lse.shape...)
	defer delta.Release()
	cpu.AttentionDelta(dims[0], data[F](g), data[F](out), data[F](delta))
	for n, b := range blocks {
		cpu.AttentionLSEBackward(dims[n], data[F](g), data[F](q), data[F](b.K), data[F](b.V), data[F](delta), data[F](lse),
			qpos, b.Pos, data[F](grads[0]), data[F](grads[1+2*n]), data[F](grads[2+2*n]))
	}
}
