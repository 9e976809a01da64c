package tensor

import (
	"fmt"
	"slices"

	"github.com/tinyacc/tinyacc/core/tensor/cpu"
)

// GroupedAttention is causal grouped-query attention of a fused qkv [B, T,
// (nHead+2·nKV)·hs]: nHead query heads, then nKV key heads, then nKV value
// heads, query head h attending with key/value head h/(nHead/nKV). The
// keys and values are read in place by every query head of their group
// (cpu.AttnDims.KVH), never repeated. Rows sit at global positions pos
// (strictly ascending; nil means 0..T-1). It returns the heads
// concatenated, [B, T, nHead·hs]. With nKV = nHead it is SelfAttention of
// Llama's fused layout.
func GroupedAttention(qkv *Tensor, nHead, nKV int, pos []int) *Tensor {
	checkFloat("GroupedAttention", qkv)
	if nHead < 1 || nKV < 1 || nHead%nKV != 0 || len(qkv.shape) != 3 || qkv.shape[2]%(nHead+2*nKV) != 0 {
		panic(fmt.Sprintf("tensor: grouped attention input %v does not split into %d q and %d k, v heads", qkv.shape, nHead, nKV))
	}
	B, T, W := qkv.shape[0], qkv.shape[1], qkv.shape[2]
	hs := W / (nHead + 2*nKV)
	if pos == nil {
		pos = make([]int, T)
		for i := range pos {
			pos[i] = i
		}
	} else {
		checkPositions("GroupedAttention", "pos", pos, T)
		pos = slices.Clone(pos)
	}
	d := cpu.AttnDims{B: B, NH: nHead, HS: hs, Tq: T, Tk: T, LdQ: W, LdK: W, LdV: W, LdO: nHead * hs, KVH: nKV,
		HalfProducts: HalfProducts(qkv)}
	kc, vc := nHead*hs, (nHead+nKV)*hs
	out := like(qkv, B, T, nHead*hs)
	var att *Tensor
	if qkv.requiresGrad {
		att = like(qkv, B, nHead, T, T)
	}
	if qkv.dtype == Float32 {
		x := qkv.f32
		cpu.AttentionPosForward(d, x, x[kc:], x[vc:], pos, pos, out.f32, dataOrNil[float32](att), nil)
	} else {
		x := qkv.f64
		cpu.AttentionPosForward(d, x, x[kc:], x[vc:], pos, pos, out.f64, dataOrNil[float64](att), nil)
	}
	if att == nil {
		return out
	}
	record(out, "grouped_attention", func(_ *Backprop, g *Tensor) []*Tensor {
		// every element of q|k|v's gradient is set, none added to
		gq := like(qkv, qkv.shape...)
		if qkv.dtype == Float32 {
			x, dx := qkv.f32, gq.f32
			cpu.AttentionPosGrad(d, g.f32, x, x[kc:], x[vc:], att.f32, pos, pos, dx, dx[kc:], dx[vc:])
		} else {
			x, dx := qkv.f64, gq.f64
			cpu.AttentionPosGrad(d, g.f64, x, x[kc:], x[vc:], att.f64, pos, pos, dx, dx[kc:], dx[vc:])
		}
		return []*Tensor{gq}
	}, qkv)
	saveBuf(out, att)
	return out
}
