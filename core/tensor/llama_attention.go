package tensor

import (
	"fmt"
)

// GroupedAttention is causal grouped-query attention of a fused qkv [B, T,
// (nHead+2·nKV)·hs]: nHead query heads, then nKV key heads, then nKV value
// heads, query head h attending with key/value head h/(nHead/nKV). The
// keys and values are read in place by every query head of their group
// (cpu.AttnDims.KVH), never repeated. Rows sit at global positions pos
// (strictly ascending; nil means 0..T-1). It returns the heads
// concatenated, [B, T, nHead·hs]. With nKV = nHead it is SelfAttention of
// Llama's fused layout, and it is SelfAttention's arithmetic in any case:
// the backward forms the probabilities again from q, k and the
// log-sum-exp, so a layer keeps its output and B·nHead·T floats, never
// the B·nHead·T·T probabilities.
func GroupedAttention(qkv *Tensor, nHead, nKV int, pos []int) *Tensor {
	checkFloat("GroupedAttention", qkv)
	if nHead < 1 || nKV < 1 || nHead%nKV != 0 || len(qkv.shape) != 3 || qkv.shape[2]%(nHead+2*nKV) != 0 {
		panic(fmt.Sprintf("tensor: grouped attention input %v does not split into %d q and %d k, v heads", qkv.shape, nHead, nKV))
	}
	out, _ := attend("GroupedAttention", qkv, nHead, nKV, pos, false)
	return out
}
