package cp

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
)

// The arithmetic both forms share. A rank holds the fused q|k|v of its
// rows, [B, T, W]: the q columns of its query heads, then the k and v
// columns of its key/value heads (GPT-2: as many as query heads, W = 3C;
// a Llama with grouped-query attention: fewer). Keys and values travel as
// one buffer kv [B, T, 2·KV] (k | v per row), their gradients as dkv of
// the same layout. The kernels of core/tensor/cpu read these layouts in
// place through their row strides, each query head reading its group's
// key/value head.

// vals is the data of t as F (float32 or float64).
func vals[F cpu.Float](t *tensor.Tensor) []F {
	if t.DType() == tensor.Float32 {
		return any(t.F32()).([]F)
	}
	return any(t.F64()).([]F)
}

// widths are the column counts of a rank's fused q|k|v: Q of the query
// heads, KV of the key (and of the value) heads, W = Q + 2·KV, KV2 = 2·KV.
type widths struct {
	NH, KVH, HS   int
	Q, KV, KV2, W int
}

// dims are the attention shapes of B batches of T queries over a key
// block of T rows: q read from qkv (stride W), k and v from kv (stride
// 2·KV), out [B, T, Q]; its products in the format half
// (tensor.HalfProducts of qkv: half-precision under mixed precision, as
// one process's).
func (w widths) dims(B, T int, half cpu.HalfFormat) cpu.AttnDims {
	return cpu.AttnDims{B: B, NH: w.NH, HS: w.HS, Tq: T, Tk: T, LdQ: w.W, LdK: w.KV2, LdV: w.KV2, LdO: w.Q, KVH: w.KVH, HalfProducts: half}
}

// kvHeads is the number of key/value heads the core reads.
func (a *Attention) kvHeads() int {
	if a.NKVHead > 0 {
		return a.NKVHead
	}
	return a.NHead
}

// shape checks qkv is [B, T, W] with W split into a.NHead query heads and
// a.kvHeads() key and value heads, and returns B, T and the widths.
func (a *Attention) shape(qkv *tensor.Tensor) (B, T int, w widths, err error) {
	s, nh, kvh := qkv.Shape(), a.NHead, a.kvHeads()
	if len(s) != 3 || nh < 1 || kvh < 1 || nh%kvh != 0 || s[2]%(nh+2*kvh) != 0 {
		return 0, 0, w, fmt.Errorf("cp: attention input %v does not split into q, k, v of %d query and %d key/value heads", s, nh, kvh)
	}
	if qkv.DType() != tensor.Float32 && qkv.DType() != tensor.Float64 {
		return 0, 0, w, fmt.Errorf("cp: attention input is %v; float32 or float64 only", qkv.DType())
	}
	hs := s[2] / (nh + 2*kvh)
	w = widths{NH: nh, KVH: kvh, HS: hs, Q: nh * hs, KV: kvh * hs, KV2: 2 * kvh * hs, W: s[2]}
	return s[0], s[1], w, nil
}

// pack copies the k and v columns of qkv into kv.
func pack[F cpu.Float](qkv, kv []F, rows int, w widths) {
	for i := 0; i < rows; i++ {
		copy(kv[i*w.KV2:(i+1)*w.KV2], qkv[i*w.W+w.Q:(i+1)*w.W])
	}
}

// unpackAdd adds dkv into the k and v columns of the gradient dqkv.
func unpackAdd[F cpu.Float](dkv, dqkv []F, rows int, w widths) {
	for i := 0; i < rows; i++ {
		dst := dqkv[i*w.W+w.Q : (i+1)*w.W]
		for j, x := range dkv[i*w.KV2 : (i+1)*w.KV2] {
			dst[j] += x
		}
	}
}

// attend merges the attention of the queries in qkv over one key block kv
// into (out, lse): the online softmax. first says (out, lse) hold nothing
// yet; then the block's result is written there directly. Otherwise it is
// computed into (tmpOut, tmpLse) and merged (cpu.AttentionMerge):
//
//	m    = max(lse, lse_b)
//	lse' = m + log(exp(lse - m) + exp(lse_b - m))
//	out' = out·exp(lse - lse') + out_b·exp(lse_b - lse')
func attend[F cpu.Float](d cpu.AttnDims, qkv, kv []F, qpos, kpos []int, out, lse, tmpOut, tmpLse []F, first bool) {
	KV := d.KVH * d.HS // the value columns of kv start after the keys
	if first {
		cpu.AttentionPosForward(d, qkv, kv, kv[KV:], qpos, kpos, out, nil, lse)
		return
	}
	cpu.AttentionPosForward(d, qkv, kv, kv[KV:], qpos, kpos, tmpOut, nil, tmpLse)
	cpu.AttentionMerge(d, out, lse, tmpOut, tmpLse)
}

// attendBack accumulates one key block's share of the gradient: into the
// q columns of dqkv and into dkv, from the final lse and delta
// (cpu.AttentionLSEBackward: P = exp(s·q·kᵀ - lse), dS = P∘(dP - delta)).
func attendBack[F cpu.Float](d cpu.AttnDims, gout, qkv, kv, delta, lse []F, qpos, kpos []int, dqkv, dkv []F) {
	KV := d.KVH * d.HS
	cpu.AttentionLSEBackward(d, gout, qkv, kv, kv[KV:], delta, lse, qpos, kpos, dqkv, dkv, dkv[KV:])
}
