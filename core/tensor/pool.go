package tensor

import (
	"runtime"
	"slices"
	"unsafe"
)

// The allocator's storage. Every buffer the allocator makes is a region
// of a slab: one allocation from the Go heap, made when no free region
// fits a request, of the request's bytes (rounded up to a cache line, so
// every region starts on a line, aligned for every dtype and for the
// kernels' vector loads). A released tensor's region waits on the free
// lists, by bytes rather than by dtype and length, for the next tensor
// that fits it; it first merges with the free regions beside it in its
// slab, and a request takes the smallest free region that holds it and
// splits off the rest, which stays free.
//
// Why merge: under mixed precision the forward keeps its activations in
// 2 bytes and the backward needs float32 buffers of twice their bytes.
// Without merging, the backward's first float32 buffers found only the
// released 2-byte ones, half their size, and took as many bytes again
// from the Go heap, which the heap kept resident: at tp 2 in bf16 the
// resident peak of one step rose above float32's although the
// allocator's peak was below it. Merged, two 2-byte activations that lay
// side by side hold one float32 gradient.
//
// Why bounded: a request splits a region of at most splitLimit times its
// bytes. A small buffer cut from a wide region would leave the wide
// request of the next step (the logits) no region to fit; a parameter's,
// gradient's or optimizer state's buffer lives for the whole run, so it
// takes a region of at most 8 times its bytes, an activation's or
// communication buffer's, which comes back within the step, one of at
// most 16 times.
//
// A buffer the allocator did not make (a backing's, SetBacking) is
// pooled whole when released, as a region of its own with no neighbours;
// one not aligned for the dtype asked is passed over. Every dtype of a
// tensor is plain numbers, so one region may hold any of them in turn; a
// tensor that takes over another's storage takes it from its first
// element, so a released buffer's first byte names its region.

// region is a run of bytes of one slab, handed out or free. Its first
// byte is a uintptr, not a pointer, so the metadata keeps no memory
// alive: a handed-out region's memory lives while its tensor does, a
// free one's while the free lists hold it (pooled.p).
type region struct {
	addr       uintptr
	bytes      int
	prev, next *region // the regions beside it in its slab, by address
	free       bool    // released: on the free lists or dropped from them (DropPool)
	slab       bool    // part of a slab the allocator made; false for a backing's buffer
}

// absorb merges n, the region after r in its slab, into r.
func (r *region) absorb(n *region) {
	r.bytes += n.bytes
	r.next = n.next
	if n.next != nil {
		n.next.prev = r
	}
}

// pooled is one region on the free lists with a pointer to its first
// byte, which keeps its slab alive.
type pooled struct {
	p unsafe.Pointer
	r *region
}

// splitLimit is the most times a request's bytes the free region it takes
// may hold (see above).
func splitLimit(cat Category) int {
	if cat == Params || cat == Grads || cat == OptimState {
		return 8
	}
	return 16
}

// take returns pooled storage of n elements of dt for category cat, nil
// if no free region fits. a.mu is held.
func (a *Allocator) take(cat Category, dt DType, n int) any {
	ask := n * dt.Size()
	if ask == 0 {
		return nil
	}
	// A region of a slab that holds ask bytes holds need, its lines; a
	// backing's buffer, taken whole, need only hold ask.
	need := roundBytes(ask)
	limit := splitLimit(cat) * need
	i, _ := slices.BinarySearch(a.sizes, ask)
	for ; i < len(a.sizes) && a.sizes[i] <= limit; i++ {
		b := a.sizes[i]
		l := a.free[b]
		for j := len(l) - 1; j >= 0; j-- {
			e := l[j]
			if uintptr(e.p)%uintptr(dt.Size()) != 0 {
				continue
			}
			a.unlist(e.r)
			r := e.r
			r.free = false
			if r.slab && r.bytes > need {
				rest := &region{addr: r.addr + uintptr(need), bytes: r.bytes - need, prev: r, next: r.next, free: true, slab: true}
				if r.next != nil {
					r.next.prev = rest
				}
				r.next, r.bytes = rest, need
				a.list(rest, unsafe.Add(e.p, need))
			}
			if r.slab {
				a.out[r.addr] = r
			}
			return storageAt(dt, e.p, n, r.bytes/dt.Size())
		}
	}
	return nil
}

// fresh returns storage of n elements of dt, n > 0, in a new slab of
// its own: the region's bytes and up to a line more, for its start on a
// line. a.mu is held.
func (a *Allocator) fresh(dt DType, n int) any {
	bytes := roundBytes(n * dt.Size())
	mem := make([]uint64, (bytes+line-8)/8)
	a.freshBytes += int64(8 * len(mem))
	p := unsafe.Pointer(unsafe.SliceData(mem))
	p = unsafe.Add(p, -int(uintptr(p))&(line-1))
	r := &region{addr: uintptr(p), bytes: bytes, slab: true}
	a.out[r.addr] = r
	// A tensor dropped without Release leaves its region handed out;
	// once nothing holds the slab, its regions leave the metadata.
	runtime.AddCleanup(&mem[0], a.forget, r)
	return storageAt(dt, p, n, bytes/dt.Size())
}

// forget removes the regions of a collected slab, first its first region,
// from the handed-out ones. Its free regions were on no free list, or the
// slab would still be alive.
func (a *Allocator) forget(first *region) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for r := first; r != nil; r = r.next {
		if a.out[r.addr] == r {
			delete(a.out, r.addr)
		}
	}
}

// put returns buf, a released tensor's storage, to the free lists: its
// region merged with the free regions beside it, or, for a buffer the
// allocator did not make, the buffer whole. a.mu is held.
func (a *Allocator) put(buf any) {
	p, bytes := bufferOf(buf)
	if bytes == 0 {
		return
	}
	r := a.out[uintptr(p)]
	if r == nil || r.bytes != bytes {
		a.list(&region{addr: uintptr(p), bytes: bytes, free: true}, p)
		return
	}
	delete(a.out, r.addr)
	r.free = true
	if n := r.next; n != nil && n.free {
		a.unlist(n)
		r.absorb(n)
	}
	if q := r.prev; q != nil && q.free {
		a.unlist(q)
		q.absorb(r)
		p = unsafe.Add(p, -int(r.addr-q.addr))
		r = q
	}
	a.list(r, p)
}

// list puts free region r, whose first byte is p, on the free lists.
func (a *Allocator) list(r *region, p unsafe.Pointer) {
	l := a.free[r.bytes]
	if len(l) == 0 {
		i, _ := slices.BinarySearch(a.sizes, r.bytes)
		a.sizes = slices.Insert(a.sizes, i, r.bytes)
	}
	a.free[r.bytes] = append(l, pooled{p, r})
}

// unlist takes free region r off the free lists if it is on them (not
// dropped by DropPool).
func (a *Allocator) unlist(r *region) {
	l := a.free[r.bytes]
	for j := range l {
		if l[j].r != r {
			continue
		}
		l = slices.Delete(l, j, j+1)
		if len(l) > 0 {
			a.free[r.bytes] = l
			return
		}
		delete(a.free, r.bytes)
		i, _ := slices.BinarySearch(a.sizes, r.bytes)
		a.sizes = slices.Delete(a.sizes, i, i+1)
		return
	}
}

// line is the bytes every region starts on a multiple of: a cache line,
// so that a vector load of a kernel never straddles two lines more often
// than the buffer's own offsets make it.
const line = 64

// roundBytes is bytes rounded up to a multiple of line.
func roundBytes(bytes int) int { return (bytes + line - 1) &^ (line - 1) }

// storageAt is the storage of n elements of dt from p on, with capacity
// c elements (the region's).
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
