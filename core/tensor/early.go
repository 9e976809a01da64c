package tensor

import "github.com/tinyacc/tinyacc/core/tensor/cpu"

// Stored activations' copies made as they are written. Under mixed
// precision StoreHalf rounds what the backward keeps into 2 bytes once a
// block's forward is done: a pass over each such activation. The ops
// whose kernels read or write an activation the backward keeps (GELU its
// input and output, LayerNorm and RMSNorm their input and output,
// RoundHalf q|k|v) write its 2-byte copy as well, while each piece is in
// cache (cpu.GeluForwardHalf, cpu.LayerNormForwardHalf,
// cpu.RMSNormForwardHalf, cpu.RoundHalfInto),
// and storeHalf takes that copy instead of rounding the tensor again:
// the same bits, rounded from the same float32 values. The copy (early)
// is only good while the float32 values stay as they were, so whatever
// may change them drops it: F32, which hands the storage to code outside
// the package, Set, CopyFrom, Zero, RoundHalf, and giving the storage
// back (releaseStorage), which also frees a copy StoreHalf never took.
// The ops write copies only inside a forward that says StoreHalf will
// follow (StoringHalf: a transformer block's), so a graph that is never
// stored holds no copies beside its float32 values.

// StoringHalf marks the forward that is about to run on t's rank as one
// whose activations StoreHalf will store once it is done, so the ops
// write their copies as they go, until the returned function is called.
// Marks nest; outside mixed precision they change nothing.
func StoringHalf(t *Tensor) (done func()) {
	a := t.home
	if a == nil {
		a = Default
	}
	a.mu.Lock()
	a.storing++
	a.mu.Unlock()
	return func() {
		a.mu.Lock()
		a.storing--
		a.mu.Unlock()
	}
}

// storingHalf reports whether a forward marked by StoringHalf runs on
// t's rank.
func storingHalf(t *Tensor) bool {
	a := t.home
	if a == nil {
		a = Default
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.storing > 0
}

// earlyHalf returns a 2-byte tensor for the copy of t's values in its
// compute dtype that an op writing or reading them may fill, or nil when
// storeHalf would not store t (or the activation t views, whose elements
// t holds in the same order, which storeHalf stores for it): that must be
// a float32 activation owning its storage under mixed precision, without
// a copy already, recorded by autograd (or, for the op's own output,
// about to be: recorded), in a forward marked by StoringHalf.
func earlyHalf(t *Tensor, recorded bool) *Tensor {
	if t.base != nil {
		t, recorded = t.base, false
	}
	if t.dtype != Float32 || t.cat != Activations || t.alloc == nil ||
		t.dropped || t.half != nil || t.early != nil {
		return nil
	}
	d := computeOf(t)
	if d == Float32 || !storingHalf(t) {
		return nil
	}
	if t.node != nil {
		recorded = !t.node.exact
	}
	if !recorded {
		return nil
	}
	a := t.home
	if a == nil {
		a = Default
	}
	return a.NewUninit(Activations, d, t.shape...)
}

// keepEarly gives t (or the activation t views) the copy h an op filled
// with t's values, if storeHalf will take it (recorded, not exact, none
// kept yet); else frees h.
func keepEarly(t, h *Tensor) {
	if h == nil {
		return
	}
	if t.base != nil {
		t = t.base
	}
	if t.node == nil || t.node.exact || t.early != nil || t.alloc == nil {
		h.Release()
		return
	}
	t.early = h
}

// dropEarly frees the copy of t's values (or of the values of the
// activation t views) made as they were written: they may change.
func (t *Tensor) dropEarly() {
	t.freeEarly()
	if t.base != nil {
		t.base.freeEarly()
	}
}

// freeEarly frees t's own copy made as its values were written, if any.
func (t *Tensor) freeEarly() {
	if e := t.early; e != nil {
		t.early = nil
		e.Release()
	}
}

// halfBits is h's 2-byte storage, nil for no copy.
func halfBits(h *Tensor) []uint16 {
	if h == nil {
		return nil
	}
	return h.u16
}

// isF16 reports whether the copy h is fp16 (else bfloat16 or none).
func isF16(h *Tensor) bool { return h != nil && h.dtype == Float16 }

// roundHalfInto is RoundHalf on t with the rounded values' 2-byte copy
// written in the same pass, kept for storeHalf; false when t takes none
// (RoundHalf then rounds alone).
func roundHalfInto(t *Tensor) bool {
	h := earlyHalf(t, false)
	if h == nil {
		return false
	}
	cpu.RoundHalfInto(h.dtype == Float16, t.f32, h.u16)
	keepEarly(t, h)
	return true
}
