package tensor

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPoolAcrossDTypes: a released 2-byte buffer serves a float32 tensor
// of the same bytes (the backward's gradient in the storage of an
// activation the forward kept in bf16) and back, taking nothing from the
// heap, and the storage holds what is written to it.
func TestPoolAcrossDTypes(t *testing.T) {
	a := NewAllocator()
	h := a.NewUninit(Activations, BFloat16, 2, 1000)
	fresh := a.FreshBytes()
	h.Release()
	f := a.NewUninit(Activations, Float32, 1000)
	require.Equal(t, fresh, a.FreshBytes(), "the float32 tensor took the bf16 buffer")
	require.Zero(t, a.PooledBytes())
	for i := range f.F32() {
		f.F32()[i] = float32(i) + 0.5
	}
	require.Equal(t, float32(999.5), f.F32()[999])
	f.Release()
	d := a.NewUninit(Activations, Float64, 500)
	i := a.NewUninit(Grads, Int32, 1) // nothing of 4 bytes waits
	require.Equal(t, fresh+4, a.FreshBytes())
	d.Release()
	i.Release()
	require.Equal(t, int64(4000+4), a.PooledBytes())
}

// TestPoolBestFit: a request takes a buffer of exactly its bytes first,
// else the smallest of at most twice its bytes, else none; a buffer taken
// wider comes back whole, and the allocator counts the bytes asked for.
func TestPoolBestFit(t *testing.T) {
	a := NewAllocator()
	var ts []*Tensor
	for _, n := range []int{1000, 1900, 1700, 4000} {
		ts = append(ts, a.NewUninit(Activations, Float32, n))
	}
	for _, t := range ts {
		t.Release()
	}
	pooled, fresh := a.PooledBytes(), a.FreshBytes()
	require.Equal(t, int64(4*(1000+1900+1700+4000)), pooled)

	x := a.NewUninit(Activations, BFloat16, 2000) // 4000 bytes: exact
	require.Equal(t, pooled-4000, a.PooledBytes())
	y := a.NewUninit(Activations, Float32, 950) // 3800 bytes: 1700's 6800, not 1900's 7600
	require.Equal(t, pooled-4000-6800, a.PooledBytes())
	require.Len(t, y.F32(), 950)
	require.Equal(t, int64(4000+3800), a.Usage().Total, "the bytes asked for are counted")
	z := a.NewUninit(Activations, Float32, 1500) // 6000 bytes: 7600 fits, 16000 is past twice
	require.Equal(t, pooled-4000-6800-7600, a.PooledBytes())
	w := a.NewUninit(Activations, Float32, 1999) // 7996 bytes: 16000 is past twice
	require.Equal(t, fresh+7996, a.FreshBytes())
	for _, t := range []*Tensor{x, y, z, w} {
		t.Release()
	}
	require.Equal(t, pooled+7996, a.PooledBytes(), "every buffer back whole")
	require.Zero(t, a.Usage().Total)
}
