package tensor

import (
	"runtime"
	"testing"
	"unsafe"
	"weak"

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
	i := a.NewUninit(Grads, Int32, 1) // nothing of 4 bytes waits: a slab of 8
	require.Equal(t, fresh+8, a.FreshBytes())
	d.Release()
	i.Release()
	require.Equal(t, int64(4000+8), a.PooledBytes())
}

// TestPoolBestFit: a request takes a free region of exactly its bytes
// first, else the smallest that holds it within the split limit of its
// category (16 times its bytes for activations, 8 for gradients), else a
// slab of its own; the rest of a wider region stays free, the allocator
// counts the bytes asked for, and released regions merge back whole.
func TestPoolBestFit(t *testing.T) {
	a := NewAllocator()
	var ts []*Tensor
	for _, n := range []int{1000, 1900, 1700, 10000} {
		ts = append(ts, a.NewUninit(Activations, Float32, n))
	}
	for _, t := range ts {
		t.Release()
	}
	pooled, fresh := a.PooledBytes(), a.FreshBytes()
	require.Equal(t, int64(4*(1000+1900+1700+10000)), pooled)
	require.Equal(t, []int{4000, 6800, 7600, 40000}, a.sizes)

	x := a.NewUninit(Activations, BFloat16, 2000) // 4000 bytes: exact
	require.Equal(t, pooled-4000, a.PooledBytes())
	y := a.NewUninit(Activations, Float32, 950) // 3800 bytes: 1700's 6800, not 1900's 7600
	require.Equal(t, pooled-4000-3800, a.PooledBytes(), "the rest of 6800 stays free")
	require.Len(t, y.F32(), 950)
	require.Equal(t, int64(4000+3800), a.Usage().Total, "the bytes asked for are counted")
	z := a.NewUninit(Activations, Float32, 1500) // 6000 bytes: 7600
	require.Equal(t, []int{1600, 3000, 40000}, a.sizes)
	w := a.NewUninit(Grads, Float32, 900) // 3600 bytes: 40000 is past 8 times
	require.Equal(t, fresh+3600, a.FreshBytes())
	v := a.NewUninit(Activations, Float32, 900) // 3600 bytes: 40000 is within 16 times
	require.Equal(t, fresh+3600, a.FreshBytes())
	require.Equal(t, []int{1600, 3000, 36400}, a.sizes)
	for _, t := range []*Tensor{x, y, z, w, v} {
		t.Release()
	}
	require.Equal(t, []int{3600, 4000, 6800, 7600, 40000}, a.sizes, "every region back whole")
	require.Equal(t, pooled+3600, a.PooledBytes())
	require.Zero(t, a.Usage().Total)
}

// TestPoolMerges: released regions side by side in one slab merge, so
// two 2-byte activations cut from one float32 buffer serve a float32
// gradient of their bytes together, whichever is released first and with
// a third between them released last; storage never overlaps a live
// neighbour's.
func TestPoolMerges(t *testing.T) {
	for _, c := range []struct {
		order []int
		sizes [][]int // the free regions' bytes after each release
	}{
		{[]int{0, 1, 2}, [][]int{{4000}, {8000}, {12000}}},
		{[]int{2, 1, 0}, [][]int{{4000}, {8000}, {12000}}},
		{[]int{0, 2, 1}, [][]int{{4000}, {4000}, {12000}}},
	} {
		a := NewAllocator()
		a.NewUninit(Activations, Float32, 3000).Release()
		fresh := a.FreshBytes()
		var hs []*Tensor
		for range 3 {
			hs = append(hs, a.NewUninit(Activations, BFloat16, 2000)) // 4000 bytes each, cut in turn
		}
		require.Equal(t, fresh, a.FreshBytes(), "order %v: the 2-byte tensors took the float32 region", c.order)
		require.Zero(t, a.PooledBytes())
		base := unsafe.Pointer(unsafe.SliceData(hs[0].U16()))
		for i, h := range hs {
			require.Equal(t, unsafe.Add(base, 4000*i), unsafe.Pointer(unsafe.SliceData(h.U16())), "order %v: side by side", c.order)
			for j := range h.U16() {
				h.U16()[j] = uint16(i + 1)
			}
		}
		for i, h := range hs {
			for _, v := range h.U16() {
				require.Equal(t, uint16(i+1), v, "order %v: no overlap", c.order)
			}
		}
		for k, i := range c.order {
			hs[i].Release()
			require.Equal(t, c.sizes[k], a.sizes, "order %v after %d releases", c.order, k+1)
			require.Equal(t, int64(4000*(k+1)), a.PooledBytes())
		}
		f := a.NewUninit(Activations, Float32, 3000)
		require.Equal(t, fresh, a.FreshBytes(), "order %v: the float32 tensor took the merged region", c.order)
		require.Equal(t, base, unsafe.Pointer(unsafe.SliceData(f.F32())))
		f.Release()
	}
}

// TestPoolDropKeepsNeighbours: DropPool takes the free regions off the
// lists, but one beside a region still handed out lies in the same slab
// and merges back when that region is released.
func TestPoolDropKeepsNeighbours(t *testing.T) {
	a := NewAllocator()
	a.NewUninit(Activations, Float32, 1000).Release()
	h := a.NewUninit(Activations, BFloat16, 1000) // 2000 of the 4000 bytes
	require.Equal(t, int64(2000), a.PooledBytes())
	a.DropPool()
	require.Zero(t, a.PooledBytes())
	h.Release()
	require.Equal(t, int64(4000), a.PooledBytes(), "the dropped half merged with h's")
	fresh := a.FreshBytes()
	a.NewUninit(Activations, Float32, 1000)
	require.Equal(t, fresh, a.FreshBytes())
}

// TestPoolHoldsNoDroppedTensor: a tensor left to the collector without
// Release is not held alive by the allocator: its slab is collected, and
// its region then leaves the allocator's record of handed-out regions.
func TestPoolHoldsNoDroppedTensor(t *testing.T) {
	a := NewAllocator()
	x := a.NewUninit(Activations, Float32, 1<<16)
	w := weak.Make(&x.F32()[0])
	a.mu.Lock()
	require.Len(t, a.out, 1)
	a.mu.Unlock()
	x = nil
	runtime.GC()
	require.Nil(t, w.Value(), "the slab was collected")
	// The cleanup that forgets the region runs on its own goroutine
	// after the collection; each collection lets queued cleanups run.
	left := 1
	for i := 0; i < 100 && left > 0; i++ {
		runtime.GC()
		runtime.Gosched()
		a.mu.Lock()
		left = len(a.out)
		a.mu.Unlock()
	}
	require.Zero(t, left, "the collected slab's region is forgotten")
}
