package cp

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
)

// Ring attention, the optimized form. The n ranks of the group form a
// ring (rank r sends to r+1 and receives from r-1, modulo n). Every rank
// keeps its queries; the key/value blocks travel:
//
//	forward, step s = 0 .. n-1: hold the block of rank (r - s) mod n;
//	  post its send to r+1 and the receive of the next block from r-1,
//	  then compute this block while they fly, merging it into (out, lse)
//	  through the online softmax (see attend), then wait and swap.
//
// n-1 transfers, each hidden behind a block's compute when the compute
// takes longer. A block entirely in the queries' causal future (every key
// position after every query position) is not computed at all; under the
// contiguous split that is every block of a higher rank, half the pairs.
//
// The backward runs the ring again. Each rank recomputes the softmax of
// each block from the final lse (no probabilities were kept) and
// accumulates dq locally. The gradient of a block's keys and values
// belongs to its owner, so it travels behind the block: at step s a rank
// adds its share into the block's accumulator received from r-1 and sends
// it on to r+1; after n steps each accumulator is back at its owner,
// holding the sum over every rank's queries. The next block's keys and
// values are again received while the current one is computed, and the
// accumulator's receive is posted before the compute too.
//
// Under mixed precision the blocks and accumulators travel in the compute
// dtype (ringWire, wire.go): half the bytes.
//
// Every rank posts its sends and receives in the same order (forward: kv;
// backward: at step s the accumulator of step s-1, then kv; at the end
// the last accumulator), which is the order the matching ranks send them
// in, so the point-to-point queues pair them up correctly.

type ringFn struct{ a *Attention }

func (f *ringFn) Forward(ctx *tensor.FuncCtx, in ...*tensor.Tensor) (*tensor.Tensor, error) {
	if in[0].DType() == tensor.Float32 {
		return ringForward[float32](f.a, ctx, in[0])
	}
	return ringForward[float64](f.a, ctx, in[0])
}

func (f *ringFn) Backward(ctx *tensor.FuncCtx, g *tensor.Tensor) ([]*tensor.Tensor, error) {
	var gq *tensor.Tensor
	var err error
	if g.DType() == tensor.Float32 {
		gq, err = ringBackward[float32](f.a, ctx, g)
	} else {
		gq, err = ringBackward[float64](f.a, ctx, g)
	}
	return []*tensor.Tensor{gq}, err
}

func ringForward[F cpu.Float](a *Attention, ctx *tensor.FuncCtx, qkv *tensor.Tensor) (*tensor.Tensor, error) {
	B, T, C, err := a.shape(qkv)
	if err != nil {
		return nil, err
	}
	n, r, al, dt := a.G.Size(), a.G.Rank(), a.alloc(), qkv.DType()
	next, prev := a.neighbours()
	kv := al.NewUninit(tensor.Comm, dt, B, T, C.KV2)
	nxt := al.NewUninit(tensor.Comm, dt, B, T, C.KV2)
	pack(vals[F](qkv), vals[F](kv), B*T, C)
	w := newRingWire(a.G, al, dt)
	defer w.release()
	w.round(kv) // every rank computes with the block as the others receive it
	d := C.dims(B, T, tensor.HalfProducts(qkv))
	out := al.New(tensor.Activations, dt, B, T, C.Q)
	lse := al.New(tensor.Activations, dt, B, a.NHead, T)
	tmpOut := al.NewUninit(tensor.Activations, dt, B, T, C.Q)
	tmpLse := al.NewUninit(tensor.Activations, dt, B, a.NHead, T)
	defer func() {
		for _, t := range []*tensor.Tensor{kv, nxt, tmpOut, tmpLse} {
			t.Release()
		}
	}()
	q, qpos := vals[F](qkv), a.Pos[r]
	for s := 0; s < n; s++ {
		src := (r - s + n) % n
		var p *pending
		if s < n-1 {
			p = a.post("kv", s, w.bytes(kv), w.send(kv, next), w.recv(nxt, prev))
		}
		if future(qpos, a.Pos[src]) {
			a.skipped()
		} else {
			a.compute("block", s, src, int64(B)*Pairs(qpos, a.Pos[src]), func() {
				attend(d, q, vals[F](kv), qpos, a.Pos[src], vals[F](out), vals[F](lse), vals[F](tmpOut), vals[F](tmpLse), s == 0)
			})
		}
		if err := p.wait(); err != nil {
			out.Release()
			lse.Release()
			return nil, a.errorf(fmt.Sprintf("ring forward step %d: send keys and values to rank %d, receive from rank %d", s, next, prev), err)
		}
		kv, nxt = nxt, kv
	}
	ctx.Save(qkv)
	ctx.Own(lse)
	ctx.Values["out"], ctx.Values["lse"] = out, lse
	return out, nil
}

func ringBackward[F cpu.Float](a *Attention, ctx *tensor.FuncCtx, gout *tensor.Tensor) (*tensor.Tensor, error) {
	qkv := ctx.Saved()[0]
	out, lse := ctx.Values["out"].(*tensor.Tensor), ctx.Values["lse"].(*tensor.Tensor)
	B, T, C, _ := a.shape(qkv)
	n, r, al, dt := a.G.Size(), a.G.Rank(), backAlloc(ctx), qkv.DType()
	next, prev := a.neighbours()
	d := C.dims(B, T, tensor.HalfProducts(qkv))
	gq := al.New(tensor.Activations, dt, B, T, C.W)
	delta := al.NewUninit(tensor.Activations, dt, B, a.NHead, T)
	cpu.AttentionDelta(d, vals[F](gout), vals[F](out), vals[F](delta))
	kv := al.NewUninit(tensor.Comm, dt, B, T, C.KV2)
	nxt := al.NewUninit(tensor.Comm, dt, B, T, C.KV2)
	acc := al.NewUninit(tensor.Comm, dt, B, T, C.KV2)
	dkv := [2]*tensor.Tensor{al.NewUninit(tensor.Comm, dt, B, T, C.KV2), al.NewUninit(tensor.Comm, dt, B, T, C.KV2)}
	pack(vals[F](qkv), vals[F](kv), B*T, C)
	w := newRingWire(a.G, al, dt)
	defer w.release()
	w.round(kv)
	var sends [2]*pending
	var inflight []*pending
	fail := func(what string, err error) (*tensor.Tensor, error) {
		waitAll(append(inflight, sends[0], sends[1])...)
		gq.Release()
		return nil, a.errorf(what, err)
	}
	defer func() {
		for _, t := range []*tensor.Tensor{delta, kv, nxt, acc, dkv[0], dkv[1]} {
			t.Release()
		}
	}()
	q, qpos := vals[F](qkv), a.Pos[r]
	for s := 0; s < n; s++ {
		src := (r - s + n) % n
		var accIn, kvIn *pending
		if s > 0 {
			accIn = a.post("dkv", s, w.bytes(acc), w.recv(acc, prev))
		}
		if s < n-1 {
			kvIn = a.post("kv", s, w.bytes(kv), w.send(kv, next), w.recv(nxt, prev))
		}
		inflight = []*pending{accIn, kvIn}
		buf := dkv[s%2]
		if err := sends[s%2].wait(); err != nil {
			return fail(fmt.Sprintf("ring backward step %d: send of a key/value gradient to rank %d", s-2, next), err)
		}
		buf.Zero()
		if !future(qpos, a.Pos[src]) {
			a.compute("block backward", s, src, 0, func() {
				attendBack(d, vals[F](gout), q, vals[F](kv), vals[F](delta), vals[F](lse), qpos, a.Pos[src], vals[F](gq), vals[F](buf))
			})
		}
		if err := accIn.wait(); err != nil {
			return fail(fmt.Sprintf("ring backward step %d: receive the key/value gradient of rank %d's block from rank %d", s, src, prev), err)
		}
		if accIn != nil {
			b, x := vals[F](buf), vals[F](acc)
			for i := range b {
				b[i] += x[i]
			}
		}
		if n > 1 {
			sends[s%2] = a.post("dkv", s, w.bytes(buf), w.send(buf, next))
		}
		if err := kvIn.wait(); err != nil {
			return fail(fmt.Sprintf("ring backward step %d: send keys and values to rank %d, receive from rank %d", s, next, prev), err)
		}
		kv, nxt = nxt, kv
	}
	inflight = nil
	own := dkv[(n-1)%2]
	if n > 1 {
		p := a.post("dkv", n, w.bytes(acc), w.recv(acc, prev))
		inflight = []*pending{p}
		if err := p.wait(); err != nil {
			return fail(fmt.Sprintf("ring backward: receive the gradient of this rank's keys and values from rank %d", prev), err)
		}
		own = acc
	}
	if err := waitAll(sends[0], sends[1]); err != nil {
		return fail(fmt.Sprintf("ring backward: send of a key/value gradient to rank %d", next), err)
	}
	unpackAdd(vals[F](own), vals[F](gq), B*T, C)
	return gq, nil
}
