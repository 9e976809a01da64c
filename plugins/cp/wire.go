package cp

import (
	"sync"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
)

// ringWire carries the ring's float32 blocks in the compute dtype under
// mixed precision (bf16/fp16, half the bytes): a buffer is rounded into its
// half twin before a send, and a receive lands in the twin and is widened
// into the buffer when it completes. Off (float32 or float64 training) it
// is the plain send and receive. The key/value blocks are rounded once, by
// their owner before the ring starts (round), so forwarding them rounds
// nothing more; a key/value gradient accumulator is rounded at every hop.
type ringWire struct {
	g    comm.Group
	a    *tensor.Allocator
	d    tensor.DType // BFloat16 or Float16; Float32: off
	twin map[*tensor.Tensor]*tensor.Tensor
}

func newRingWire(g comm.Group, a *tensor.Allocator, dt tensor.DType) *ringWire {
	d := a.Compute()
	if dt != tensor.Float32 || (d != tensor.BFloat16 && d != tensor.Float16) {
		d = tensor.Float32
	}
	return &ringWire{g: g, a: a, d: d, twin: map[*tensor.Tensor]*tensor.Tensor{}}
}

func (w *ringWire) on() bool { return w.d != tensor.Float32 }

// round rounds the float32 block x to the wire dtype in place.
func (w *ringWire) round(x *tensor.Tensor) {
	switch w.d {
	case tensor.BFloat16:
		cpu.RoundBF16(x.F32())
	case tensor.Float16:
		cpu.RoundF16(x.F32())
	}
}

func (w *ringWire) twinOf(x *tensor.Tensor) *tensor.Tensor {
	t := w.twin[x]
	if t == nil {
		t = w.a.NewUninit(tensor.Comm, w.d, x.Numel())
		w.twin[x] = t
	}
	return t
}

// bytes is what x weighs on the wire.
func (w *ringWire) bytes(x *tensor.Tensor) int64 {
	if !w.on() {
		return x.Bytes()
	}
	return int64(x.Numel()) * int64(w.d.Size())
}

// send starts the send of x to rank to.
func (w *ringWire) send(x *tensor.Tensor, to int) comm.Handle {
	if !w.on() {
		return w.g.SendAsync(x, to)
	}
	t := w.twinOf(x)
	tensor.NarrowHalf(w.d, t.U16(), x.F32())
	return w.g.SendAsync(t, to)
}

// recv starts the receive into x from rank from; x holds the block once
// the handle's Wait returned nil.
func (w *ringWire) recv(x *tensor.Tensor, from int) comm.Handle {
	if !w.on() {
		return w.g.RecvAsync(x, from)
	}
	t := w.twinOf(x)
	return &widening{h: w.g.RecvAsync(t, from), x: x, t: t}
}

// release gives the twins back.
func (w *ringWire) release() {
	for _, t := range w.twin {
		t.Release()
	}
}

// widening is a receive into a half twin that widens into its float32
// buffer once, when it first completes.
type widening struct {
	h    comm.Handle
	x, t *tensor.Tensor
	once sync.Once
	err  error
}

func (r *widening) Wait() error {
	r.once.Do(func() {
		if r.err = r.h.Wait(); r.err == nil {
			tensor.WidenHalf(r.t.DType(), r.x.F32(), r.t.U16())
		}
	})
	return r.err
}
