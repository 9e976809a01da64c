package cp

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
)

// The arithmetic both forms share. A rank holds the fused q|k|v of its
// rows, [B, T, 3C] (C: the width of the heads it computes). Keys and
// values travel as one buffer kv [B, T, 2C] (k | v per row), their
// gradients as dkv of the same layout. The kernels of core/tensor/cpu
// read these layouts in place through their row strides.

// vals is the data of t as F (float32 or float64).
func vals[F cpu.Float](t *tensor.Tensor) []F {
	if t.DType() == tensor.Float32 {
		return any(t.F32()).([]F)
	}
	return any(t.F64()).([]F)
}

// dims are the attention shapes of B rows-batches of T queries over a
// key block of T rows: q read from qkv (stride 3C), k and v from kv
// (stride 2C), out [B, T, C].
func dims(B, T, C, nHead int) cpu.AttnDims {
	return cpu.AttnDims{B: B, NH: nHead, HS: C / nHead, Tq: T, Tk: T, LdQ: 3 * C, LdK: 2 * C, LdV: 2 * C, LdO: C}
}

// shape checks qkv is [B, T, 3C] with C split into nHead heads and
// returns B, T, C.
func shape(qkv *tensor.Tensor, nHead int) (B, T, C int, err error) {
	s := qkv.Shape()
	if len(s) != 3 || s[2]%3 != 0 || nHead < 1 || (s[2]/3)%nHead != 0 {
		return 0, 0, 0, fmt.Errorf("cp: attention input %v does not split into q, k, v of %d heads", s, nHead)
	}
	if qkv.DType() != tensor.Float32 && qkv.DType() != tensor.Float64 {
		return 0, 0, 0, fmt.Errorf("cp: attention input is %v; float32 or float64 only", qkv.DType())
	}
	return s[0], s[1], s[2] / 3, nil
}

// pack copies the k and v columns of qkv into kv.
func pack[F cpu.Float](qkv, kv []F, rows, C int) {
	for i := 0; i < rows; i++ {
		copy(kv[i*2*C:(i+1)*2*C], qkv[i*3*C+C:(i+1)*3*C])
	}
}

// unpackAdd adds dkv into the k and v columns of the gradient dqkv.
func unpackAdd[F cpu.Float](dkv, dqkv []F, rows, C int) {
	for i := 0; i < rows; i++ {
		dst := dqkv[i*3*C+C : (i+1)*3*C]
		for j, x := range dkv[i*2*C : (i+1)*2*C] {
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
	C := d.NH * d.HS
	if first {
		cpu.AttentionPosForward(d, qkv, kv, kv[C:], qpos, kpos, out, nil, lse)
		return
	}
	cpu.AttentionPosForward(d, qkv, kv, kv[C:], qpos, kpos, tmpOut, nil, tmpLse)
	cpu.AttentionMerge(d, out, lse, tmpOut, tmpLse)
}

// attendBack accumulates one key block's share of the gradient: into the
// q columns of dqkv and into dkv, from the final lse and delta
// (cpu.AttentionLSEBackward: P = exp(s·q·kᵀ - lse), dS = P∘(dP - delta)).
func attendBack[F cpu.Float](d cpu.AttnDims, gout, qkv, kv, delta, lse []F, qpos, kpos []int, dqkv, dkv []F) {
	C := d.NH * d.HS
	cpu.AttentionLSEBackward(d, gout, qkv, kv, kv[C:], delta, lse, qpos, kpos, dqkv, dkv, dkv[C:])
}
