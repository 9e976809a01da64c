package cp

import (
	"math/rand"
	"time"

	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
)

// TimeRank measures, in this process and with no communication, the
// attention work rank r of a group holding pos does per layer and batch:
// forward and backward of its queries over every key block the ring
// computes (those not entirely in the future), on random float32 data of
// B sequences, nHead heads and width C. It returns the time of one run
// (after a first, untimed one), and the visible (query, key) pairs per
// sequence. Ranks measured one after the other in one process see the
// same machine, which timing them inside a distributed run does not
// guarantee.
func TimeRank(B, nHead, C int, pos [][]int, r int) (time.Duration, int64) {
	T := len(pos[r])
	rng := rand.New(rand.NewSource(int64(r)))
	fill := func(shape ...int) *tensor.Tensor {
		t := tensor.New(tensor.Float32, shape...)
		for i := range t.F32() {
			t.F32()[i] = float32(rng.NormFloat64())
		}
		return t
	}
	qkv, gout := fill(B, T, 3*C), fill(B, T, C)
	kvs := make([]*tensor.Tensor, len(pos))
	var pairs int64
	for j := range pos {
		kvs[j] = fill(B, T, 2*C)
		pairs += Pairs(pos[r], pos[j])
	}
	d := widths{NH: nHead, KVH: nHead, HS: C / nHead, Q: C, KV: C, KV2: 2 * C, W: 3 * C}.dims(B, T, cpu.NoHalf)
	out, lse := tensor.New(tensor.Float32, B, T, C), tensor.New(tensor.Float32, B, nHead, T)
	tmpOut, tmpLse := tensor.New(tensor.Float32, B, T, C), tensor.New(tensor.Float32, B, nHead, T)
	delta := tensor.New(tensor.Float32, B, nHead, T)
	gq, dkv := tensor.New(tensor.Float32, B, T, 3*C), tensor.New(tensor.Float32, B, T, 2*C)
	var runs []time.Duration
	for k := 0; k < 2; k++ {
		t0 := time.Now()
		for s := range pos {
			j := (r - s + len(pos)) % len(pos)
			if !future(pos[r], pos[j]) {
				attend(d, qkv.F32(), kvs[j].F32(), pos[r], pos[j], out.F32(), lse.F32(), tmpOut.F32(), tmpLse.F32(), s == 0)
			}
		}
		cpu.AttentionDelta(d, gout.F32(), out.F32(), delta.F32())
		for s := range pos {
			j := (r - s + len(pos)) % len(pos)
			if !future(pos[r], pos[j]) {
				attendBack(d, gout.F32(), qkv.F32(), kvs[j].F32(), delta.F32(), lse.F32(), pos[r], pos[j], gq.F32(), dkv.F32())
			}
		}
		runs = append(runs, time.Since(t0))
	}
	return runs[1], pairs
}
