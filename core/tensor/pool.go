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
// smallest that holds it with at most twice its bytes (the rest of the
// buffer goes with it and comes back with it), else none. Every dtype
// of a tensor is plain numbers, so one buffer may hold any of them in
// turn; a buffer not aligned for the dtype asked is passed over.

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
		if best > need {
			a.wide[b.p] = best
		}
		return storageAt(dt, b.p, n)
	}
	return nil
}

// put adds buf, a released tensor's storage, to the free lists, with the
// whole of the buffer it was taken from. a.mu is held.
func (a *Allocator) put(buf any) {
	p, bytes := bufferOf(buf)
	if bytes == 0 {
		return
	}
	if w, ok := a.wide[p]; ok {
		bytes = w
		delete(a.wide, p)
	}
	a.free[bytes] = append(a.free[bytes], pooled{p, bytes})
}

// storageAt is the storage of n elements of dt from p on.
func storageAt(dt DType, p unsafe.Pointer, n int) any {
	switch dt {
	case Float32:
		return unsafe.Slice((*float32)(p), n)
	case Float64:
		return unsafe.Slice((*float64)(p), n)
	case Int32:
		return unsafe.Slice((*int32)(p), n)
	case BFloat16, Float16:
		return unsafe.Slice((*uint16)(p), n)
	}
	panic("tensor: no storage for " + dt.String())
}

// bufferOf is storage's first byte and its bytes (0 for none).
func bufferOf(buf any) (unsafe.Pointer, int) {
	switch s := buf.(type) {
	case []float32:
		return unsafe.Pointer(unsafe.SliceData(s)), 4 * len(s)
	case []float64:
		return unsafe.Pointer(unsafe.SliceData(s)), 8 * len(s)
	case []int32:
		return unsafe.Pointer(unsafe.SliceData(s)), 4 * len(s)
	case []uint16:
		return unsafe.Pointer(unsafe.SliceData(s)), 2 * len(s)
	}
	return nil, 0
}
