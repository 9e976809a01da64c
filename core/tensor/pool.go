package tensor

import "unsafe"

// The allocator's free lists. A released tensor's storage waits on a
// list for the next tensor that fits it, by bytes rather than by dtype
// and length: under mixed precision the forward keeps its activations in
// 2 bytes and the backward needs float32 buffers, and the optimizer step
// needs communication buffers of sizes no activation has, so lists by
// dtype and length would hold the forward's buffers idle while the
// backward and the step took as many bytes again from the Go heap. A
// request takes a buffer of exactly its bytes if one waits, else the
// smallest that holds it with at most twice its bytes, else none. The
// rest of a wider buffer goes with it as the storage's capacity and comes
// back with it: a released tensor's storage is pooled with its capacity,
// which only the allocator's own slices carry beyond their length (the
// pool's here, and the heap's and a backing's, whose capacity is their
// length; a tensor that takes over another's storage takes it from its
// first element). Every dtype of a tensor is plain numbers, so one buffer
// may hold any of them in turn; a buffer not aligned for the dtype asked
// is passed over.

// pooled is one buffer on the free lists: its first byte and its bytes.
type pooled struct {
	p     unsafe.Pointer
	bytes int
}

// take returns pooled storage of n elements of dt, nil if no buffer fits.
// a.mu is held.
func (a *Allocator) take(dt DType, n int) any {
	need := n * dt.Size()
	if need == 0 {
		return nil
	}
	best := -1
	if len(a.free[need]) > 0 {
		best = need
	} else {
		for b, l := range a.free {
			if b > need && b <= 2*need && len(l) > 0 && (best < 0 || b < best) {
				best = b
			}
		}
	}
	if best < 0 {
		return nil
	}
	l := a.free[best]
	for i := len(l) - 1; i >= 0; i-- {
		b := l[i]
		if uintptr(b.p)%uintptr(dt.Size()) != 0 {
			continue
		}
		l = append(l[:i], l[i+1:]...)
		if len(l) == 0 {
			delete(a.free, best)
		} else {
			a.free[best] = l
		}
		return storageAt(dt, b.p, n, best/dt.Size())
	}
	return nil
}

// put adds buf, a released tensor's storage, to the free lists with its
// capacity: the whole of the buffer it was taken from. a.mu is held.
func (a *Allocator) put(buf any) {
	p, bytes := bufferOf(buf)
	if bytes == 0 {
		return
	}
	a.free[bytes] = append(a.free[bytes], pooled{p, bytes})
}

// storageAt is the storage of n elements of dt from p on, with capacity
// c elements (the buffer's).
func storageAt(dt DType, p unsafe.Pointer, n, c int) any {
	switch dt {
	case Float32:
		return unsafe.Slice((*float32)(p), c)[:n]
	case Float64:
		return unsafe.Slice((*float64)(p), c)[:n]
	case Int32:
		return unsafe.Slice((*int32)(p), c)[:n]
	case BFloat16, Float16:
		return unsafe.Slice((*uint16)(p), c)[:n]
	}
	panic("tensor: no storage for " + dt.String())
}

// bufferOf is storage's first byte and the bytes of its capacity (0 for
// none).
func bufferOf(buf any) (unsafe.Pointer, int) {
	switch s := buf.(type) {
	case []float32:
		return unsafe.Pointer(unsafe.SliceData(s)), 4 * cap(s)
	case []float64:
		return unsafe.Pointer(unsafe.SliceData(s)), 8 * cap(s)
	case []int32:
		return unsafe.Pointer(unsafe.SliceData(s)), 4 * cap(s)
	case []uint16:
		return unsafe.Pointer(unsafe.SliceData(s)), 2 * cap(s)
	}
	return nil, 0
}
