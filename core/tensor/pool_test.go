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
	h := a.NewUninit(Activations, BFloat16, 2, 1024)
	fresh := a.FreshBytes()
	h.Release()
	f := a.NewUninit(Activations, Float32, 1024)
	require.Equal(t, fresh, a.FreshBytes(), "the float32 tensor took the bf16 buffer")
	require.Zero(t, a.PooledBytes())
	for i := range f.F32() {
		f.F32()[i] = float32(i) + 0.5
	}
	require.Equal(t, float32(1023.5), f.F32()[1023])
	f.Release()
	d := a.NewUninit(Activations, Float64, 512)
	i := a.NewUninit(Grads, Int32, 1) // nothing of 4 bytes waits: a line, in a slab of up to a line more
	require.Equal(t, fresh+64+56, a.FreshBytes())
	d.Release()
	i.Release()
	require.Equal(t, int64(4096+64), a.PooledBytes())
}

// TestPoolBestFit: a request takes a free region of exactly its bytes
// first, else the smallest that holds it within the split limit of its
// category (16 times its bytes for activations, 8 for gradients), else a
// slab of its own; the rest of a wider region stays free, the allocator
// counts the bytes asked for, and released regions merge back whole.
func TestPoolBestFit(t *testing.T) {
	a := NewAllocator()
	var ts []*Tensor
	for _, n := range []int{1024, 1904, 1712, 10000} {
		ts = append(ts, a.NewUninit(Activations, Float32, n))
	}
	for _, t := range ts {
		t.Release()
	}
	pooled, fresh := a.PooledBytes(), a.FreshBytes()
	require.Equal(t, int64(4*(1024+1904+1712+10000)), pooled)
	require.Equal(t, []int{4096, 6848, 7616, 40000}, a.sizes)

	x := a.NewUninit(Activations, BFloat16, 2048) // 4096 bytes: exact
	require.Equal(t, pooled-4096, a.PooledBytes())
	y := a.NewUninit(Activations, Float32, 950) // 3800 bytes, a region of 3840: 1712's 6848, not 1904's 7616
	require.Equal(t, pooled-4096-3840, a.PooledBytes(), "the rest of 6848 stays free")
	require.Len(t, y.F32(), 950)
	require.Equal(t, int64(4096+3800), a.Usage().Total, "the bytes asked for are counted")
	z := a.NewUninit(Activations, Float32, 1504) // 6016 bytes: 7616
	require.Equal(t, []int{1600, 3008, 40000}, a.sizes)
	w := a.NewUninit(Grads, Float32, 912) // 3648 bytes: 40000 is past 8 times
	require.Equal(t, fresh+3648+56, a.FreshBytes())
	v := a.NewUninit(Activations, Float32, 912) // 3648 bytes: 40000 is within 16 times
	require.Equal(t, fresh+3648+56, a.FreshBytes())
	require.Equal(t, []int{1600, 3008, 36352}, a.sizes)
	require.Zero(t, uintptr(unsafe.Pointer(unsafe.SliceData(x.U16())))%line, "every region starts on a cache line")
	for _, u := range []*Tensor{y, z, w, v} {
		require.Zero(t, uintptr(unsafe.Pointer(unsafe.SliceData(u.F32())))%line, "every region starts on a cache line")
	}
	for _, t := range []*Tensor{x, y, z, w, v} {
		t.Release()
	}
	require.Equal(t, []int{3648, 4096, 6848, 7616, 40000}, a.sizes, "every region back whole")
	require.Equal(t, pooled+3648, a.PooledBytes())
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
		{[]int{0, 1, 2}, [][]int{{4096}, {8192}, {12288}}},
		{[]int{2, 1, 0}, [][]int{{4096}, {8192}, {12288}}},
		{[]int{0, 2, 1}, [][]int{{4096}, {4096}, {12288}}},
	} {
		a := NewAllocator()
		a.NewUninit(Activations, Float32, 3072).Release()
		fresh := a.FreshBytes()
		var hs []*Tensor
		for range 3 {
			hs = append(hs, a.NewUninit(Activations, BFloat16, 2048)) // 4096 bytes each, cut in turn
		}
		require.Equal(t, fresh, a.FreshBytes(), "order %v: the 2-byte tensors took the float32 region", c.order)
		require.Zero(t, a.PooledBytes())
		base := unsafe.Pointer(unsafe.SliceData(hs[0].U16()))
		for i, h := range hs {
			require.Equal(t, unsafe.Add(base, 4096*i), unsafe.Pointer(unsafe.SliceData(h.U16())), "order %v: side by side", c.order)
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
			require.Equal(t, int64(4096*(k+1)), a.PooledBytes())
		}
		f := a.NewUninit(Activations, Float32, 3072)
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
	a.NewUninit(Activations, Float32, 1024).Release()
	h := a.NewUninit(Activations, BFloat16, 1024) // 2048 of the 4096 bytes
	require.Equal(t, int64(2048), a.PooledBytes())
	a.DropPool()
	require.Zero(t, a.PooledBytes())
	h.Release()
	require.Equal(t, int64(4096), a.PooledBytes(), "the dropped half merged with h's")
	fresh := a.FreshBytes()
	a.NewUninit(Activations, Float32, 1024)
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

// TestPoolBackingWhole: a buffer the allocator did not make (a
// backing's) is pooled whole when released, serves a request of its own
// bytes though they are no whole number of lines, and merges with
// nothing.
func TestPoolBackingWhole(t *testing.T) {
	a := NewAllocator()
	own := make([]float32, 1000) // 4000 bytes
	a.SetBacking(func(dt DType, n int) any { return own[:n] })
	b := a.NewUninit(Activations, Float32, 1000)
	a.SetBacking(nil)
	require.Zero(t, a.FreshBytes())
	b.Release()
	require.Equal(t, int64(4000), a.PooledBytes())
	h := a.NewUninit(Activations, BFloat16, 2000)
	require.Zero(t, a.FreshBytes(), "the backing's buffer served the request")
	require.Equal(t, unsafe.Pointer(unsafe.SliceData(own)), unsafe.Pointer(unsafe.SliceData(h.U16())))
	require.Zero(t, a.PooledBytes(), "taken whole")
	h.Release()
	require.Equal(t, []int{4000}, a.sizes)
}
