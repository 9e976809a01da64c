package tensor

import (
	"fmt"
	"sync"
)

// Category tags a buffer for memory accounting.
type Category int

const (
	Params Category = iota
	Grads
	OptimState
	Activations
	Comm
	Other // caller-owned memory wrapped by FromF32 and friends; not counted
	numCategories
)

var categoryNames = [...]string{"params", "grads", "optim", "activations", "comm", "other"}

func (c Category) String() string {
	if c >= 0 && int(c) < len(categoryNames) {
		return categoryNames[c]
	}
	return fmt.Sprintf("category(%d)", int(c))
}

// Allocator hands out tensor storage and keeps, per category, the bytes in
// use and the peak. Released buffers are kept on free lists by their bytes
// (pool.go) so a training loop reuses its activation buffers instead of
// churning the garbage collector. One Allocator per rank gives per-rank
// accounting; the local comm backend runs several ranks in one process,
// each with its own.
type Allocator struct {
	mu    sync.Mutex
	cur   [numCategories]int64
	peak  [numCategories]int64
	total int64
	tpeak int64
	wpeak int64 // the most bytes in use since StartWindow
	// The free regions by their bytes, those bytes in increasing order,
	// and the regions of the allocator's slabs handed out, by their first
	// byte (pool.go).
	free       map[int][]pooled
	sizes      []int
	out        map[uintptr]*region
	freshBytes int64 // slabs taken from the Go heap: FreshBytes
	noPool     bool
	// backing, when set, supplies the storage of new tensors (see
	// SetBacking); nil means the Go heap.
	backing func(dtype DType, n int) any
	// compute is the dtype of this rank's matrix products (precision.go);
	// Float32, the zero value, means the tensors' own.
	compute DType
	// storing counts the forwards under way whose activations StoreHalf
	// will store when they are done (StoringHalf, early.go).
	storing int
}

// SetBacking makes the allocator take the storage of tensors it creates
// from now on from fn instead of the Go heap (nil restores the heap). fn
// returns a []float32, []float64 or []int32 of n elements, matching dtype,
// or nil to fall back to the heap. A plugin process uses it while a plugin
// prepares, so the buffers the plugin allocates (DDP's gradient buckets)
// lie in memory shared with the trainer. Free lists are bypassed while it
// is set: a pooled heap buffer must not stand in for shared memory.
func (a *Allocator) SetBacking(fn func(dtype DType, n int) any) {
	a.mu.Lock()
	a.backing = fn
	a.mu.Unlock()
}

// Default is the allocator of New and of tensors created without an explicit
// allocator.
var Default = NewAllocator()

// NewAllocator returns an empty allocator.
func NewAllocator() *Allocator {
	return &Allocator{free: map[int][]pooled{}, out: map[uintptr]*region{}}
}

// New returns a zeroed tensor of category cat.
func (a *Allocator) New(cat Category, dtype DType, shape ...int) *Tensor {
	t := a.NewUninit(cat, dtype, shape...)
	t.Zero()
	return t
}

// NewUninit returns a tensor whose elements are unspecified (a reused buffer
// keeps old values); for outputs a kernel overwrites entirely.
func (a *Allocator) NewUninit(cat Category, dtype DType, shape ...int) *Tensor {
	n := Numel(shape)
	t := &Tensor{shape: clone(shape), dtype: dtype, dev: CPU, cat: cat, alloc: a, home: a}
	a.mu.Lock()
	t.acct = a.accountAs(cat, dtype) // precision.go
	var buf any
	if a.backing != nil {
		buf = a.backing(dtype, n)
	} else {
		buf = a.take(cat, dtype, n)
	}
	if buf == nil && n > 0 {
		buf = a.fresh(dtype, n)
	}
	b := int64(n) * int64(dtype.Size())
	a.cur[t.acct] += b
	a.total += b
	if a.cur[t.acct] > a.peak[t.acct] {
		a.peak[t.acct] = a.cur[t.acct]
	}
	if a.total > a.tpeak {
		a.tpeak = a.total
	}
	a.wpeak = max(a.wpeak, a.total)
	a.mu.Unlock()
	switch dtype {
	case Float32:
		if buf != nil {
			t.f32 = buf.([]float32)
		} else {
			t.f32 = make([]float32, n)
		}
	case Float64:
		if buf != nil {
			t.f64 = buf.([]float64)
		} else {
			t.f64 = make([]float64, n)
		}
	case Int32:
		if buf != nil {
			t.i32 = buf.([]int32)
		} else {
			t.i32 = make([]int32, n)
		}
	case BFloat16, Float16:
		if buf != nil {
			t.u16 = buf.([]uint16)
		} else {
			t.u16 = make([]uint16, n)
		}
	default:
		panic("tensor: no storage for " + dtype.String())
	}
	return t
}

// Release returns t's storage to its allocator, and its half-precision
// copy if it has one (a parameter's, or the 2-byte form of an activation
// kept for the backward: precision.go). t must not be used afterwards.
// Releasing a tensor that was not allocated (FromF32) or twice is a no-op.
func (t *Tensor) Release() {
	t.dropHalf()
	t.releaseStorage()
}

// releaseStorage gives t's own storage back, leaving a half-precision
// copy alone; a copy made as its values were written (early.go) goes
// with it.
func (t *Tensor) releaseStorage() {
	t.freeEarly() // a copy StoreHalf never took (early.go)
	a := t.alloc
	if a == nil {
		return
	}
	t.alloc = nil
	b := t.Bytes()
	var buf any
	switch t.dtype {
	case Float32:
		buf = t.f32
	case Float64:
		buf = t.f64
	case Int32:
		buf = t.i32
	case BFloat16, Float16:
		buf = t.u16
	}
	t.f32, t.f64, t.i32, t.u16 = nil, nil, nil, nil
	a.mu.Lock()
	a.cur[t.acct] -= b
	a.total -= b
	if !a.noPool && buf != nil {
		a.put(buf)
	}
	a.mu.Unlock()
}

// Recategorize moves t's bytes from its category to cat (e.g. a buffer built
// as activations that becomes a parameter).
func (t *Tensor) Recategorize(cat Category) {
	if a := t.alloc; a != nil {
		a.mu.Lock()
		acct := a.accountAs(cat, t.dtype)
		a.cur[t.acct] -= t.Bytes()
		a.cur[acct] += t.Bytes()
		if a.cur[acct] > a.peak[acct] {
			a.peak[acct] = a.cur[acct]
		}
		t.acct = acct
		a.mu.Unlock()
	}
	t.cat = cat
}

// Usage is a snapshot of an allocator's accounting.
type Usage struct {
	Current   [numCategories]int64
	Peak      [numCategories]int64
	Total     int64 // bytes in use now, all categories
	TotalPeak int64 // the most bytes in use at once
}

// Usage returns the current accounting.
func (a *Allocator) Usage() Usage {
	a.mu.Lock()
	defer a.mu.Unlock()
	return Usage{Current: a.cur, Peak: a.peak, Total: a.total, TotalPeak: a.tpeak}
}

// ResetPeak sets every peak to the current value, for a caller measuring
// one phase on its own. The trainer never calls it: its memory report
// covers construction, loading and the steps.
func (a *Allocator) ResetPeak() {
	a.mu.Lock()
	a.peak = a.cur
	a.tpeak = a.total
	a.mu.Unlock()
}

// StartWindow starts measuring the peak of a phase (a checkpoint save or
// load) and returns the bytes in use now; WindowPeak minus it is the most
// the phase added at once.
func (a *Allocator) StartWindow() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.wpeak = a.total
	return a.total
}

// WindowPeak is the most bytes in use at once since StartWindow.
func (a *Allocator) WindowPeak() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.wpeak
}

// PooledBytes is the storage the free lists hold: released, so counted in
// no category, but still in the heap until reused or DropPool.
func (a *Allocator) PooledBytes() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var n int64
	for b, l := range a.free {
		n += int64(len(l)) * int64(b)
	}
	return n
}

// FreshBytes is the storage the allocator has taken from the Go heap
// since it was made: the slabs (pool.go) of every buffer it handed out
// that came neither from its free lists nor from a backing. Once a training loop has run a step,
// the next ones take none: each buffer they need, a released activation,
// gathered unit or gradient, is on the free lists already. Storage taken
// anew is the heap's to grow by, and the garbage of a buffer it replaced.
func (a *Allocator) FreshBytes() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.freshBytes
}

// DropPool frees the cached buffers to the garbage collector.
func (a *Allocator) DropPool() {
	a.mu.Lock()
	a.free, a.sizes = map[int][]pooled{}, nil
	a.mu.Unlock()
}

// NewShell returns a tensor of the given shape with no storage yet: a
// parameter described before a rank knows which part of it it holds.
// Allocate gives it storage; ops on it allocate their outputs from a.
func (a *Allocator) NewShell(cat Category, dtype DType, shape ...int) *Tensor {
	return &Tensor{shape: clone(shape), dtype: dtype, dev: CPU, cat: cat, home: a}
}

// Allocate gives a tensor without storage (NewShell, DropStorage) zeroed
// storage of its shape and category from its home allocator.
func (t *Tensor) Allocate() {
	if t.HasStorage() {
		panic(fmt.Sprintf("tensor: Allocate on %s, which has storage", t))
	}
	a := t.home
	if a == nil {
		a = Default
	}
	s := a.New(t.cat, t.dtype, t.shape...)
	t.f32, t.f64, t.i32, t.u16, t.alloc, t.acct = s.f32, s.f64, s.i32, s.u16, a, s.acct
}
