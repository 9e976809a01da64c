package tensor

import (
	"math/rand"
	"testing"

	"github.com/stretchr/testify/require"
)

// earlyGraph builds x = Linear(p, w1), n = LayerNorm(x), h = Linear(n, w2)
// rounded (RoundHalf), y = Gelu(h) and z = Linear(y, w3) on allocator a,
// marked as a forward StoreHalf follows when storing: LayerNorm writes
// x's and n's copies, RoundHalf h's, Gelu y's.
func earlyGraph(a *Allocator, grad, storing bool) (x, n, h, y, z *Tensor) {
	rng := rand.New(rand.NewSource(9))
	param := func(shape ...int) *Tensor {
		t := a.New(Params, Float32, shape...)
		for i := range t.f32 {
			t.f32[i] = float32(rng.NormFloat64())
		}
		if grad {
			t.RequiresGrad()
		}
		return t
	}
	p, w1, lw, lb, w2, w3 := param(5, 8), param(8, 300), param(300), param(300), param(300, 40), param(40, 6)
	if storing {
		defer StoringHalf(p)()
	}
	x = Linear(p, w1, nil)
	n = LayerNorm(x, lw, lb, 1e-5)
	h = Linear(n, w2, nil)
	RoundHalf(h)
	y = Gelu(h)
	z = Linear(y, w3, nil)
	return x, n, h, y, z
}

// TestStoreHalfTakesEarlyCopies: under bf16 and fp16 the copies the
// forward ops wrote as they went are the ones StoreHalf keeps (not made
// again), holding bitwise the float32 values rounded to nearest even; a
// copy whose tensor was handed out by F32 is dropped and StoreHalf rounds
// that one itself, to the same bits.
func TestStoreHalfTakesEarlyCopies(t *testing.T) {
	for _, d := range []DType{BFloat16, Float16} {
		a := NewAllocator()
		a.SetCompute(d)
		x, n, h, y, z := earlyGraph(a, true, true)
		ts := []*Tensor{x, n, h, y}
		names := []string{"linear's output read by layernorm", "layernorm's output", "rounded q|k|v", "gelu's output"}
		want := make([][]uint16, len(ts))
		early := make([]*Tensor, len(ts))
		for i, t0 := range ts {
			require.NotNil(t, t0.early, "%s %s: a copy made as it was written", d, names[i])
			early[i] = t0.early
			want[i] = make([]uint16, t0.Numel())
			NarrowHalf(d, want[i], t0.f32)
		}
		_ = n.F32() // handed out: its copy may go stale
		require.Nil(t, n.early, "%s: F32 drops the copy", d)
		StoreHalf(z, x)
		for i, t0 := range ts {
			require.True(t, t0.stored(), "%s %s stored", d, names[i])
			require.Equal(t, want[i], t0.half.u16, "%s %s: the copy holds the rounded values", d, names[i])
			if t0 != n {
				require.Same(t, early[i], t0.half, "%s %s: StoreHalf kept the copy made as it was written", d, names[i])
			}
		}
	}
}

// TestEarlyCopiesFreed: a forward without gradients, or not marked as
// one StoreHalf follows, makes no copies, and every copy StoreHalf never
// takes goes with its tensor's storage, so giving back what the forward
// made leaves the allocator where it would be without them.
func TestEarlyCopiesFreed(t *testing.T) {
	for _, c := range [][2]bool{{false, true}, {true, false}} {
		a := NewAllocator()
		a.SetCompute(BFloat16)
		x, n, h, y, z := earlyGraph(a, c[0], c[1])
		for _, t0 := range []*Tensor{x, n, h, y, z} {
			require.Nil(t, t0.early, "gradients %v, marked %v: no copy", c[0], c[1])
		}
	}
	// What stays after the tensors are given back (the norm's statistics,
	// kept with the graph) is what it is without mixed precision.
	left := func(d DType) int64 {
		b := NewAllocator()
		b.SetCompute(d)
		x, n, h, y, z := earlyGraph(b, true, true)
		require.Equal(t, d != Float32, y.early != nil)
		for _, t0 := range []*Tensor{x, n, h, y, z} {
			t0.Release()
		}
		return b.Usage().Current[Activations]
	}
	require.Equal(t, left(Float32), left(BFloat16), "the copies went with their tensors")
}
