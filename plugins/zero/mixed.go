package zero

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// Mixed precision (train.mixed_precision bf16 or fp16 on float32 masters).
// Every stage keeps only this rank's shard of the float32 masters, beside
// the moments it steps with them, and the forward and backward read
// 2-byte copies:
//
//	stages 1, 2  the unit's whole 2-byte copy (copy) is permanent. After
//	             a step (or a load) each rank rounds its updated master
//	             shard into its own range of the copy, and one all-gather
//	             of 2-byte elements per unit completes every rank's copy,
//	             before the next unit is used (refresh).
//	stage 3      the master shard is rounded into a 2-byte send buffer and
//	             the unit's 2-byte copy (wire) is all-gathered for its
//	             forward and backward only.
//
// The operations read float32 tensors, so a unit's parameters are aliased,
// for its forward and its backward only (the module hooks of stage3.go, in
// every stage), to a float32 buffer (flat) widened from the 2-byte copy,
// counted as communication: it holds nothing but the copy's values. Every
// op reads a parameter as its copy in every layout (tensor/precision.go):
// one process and the others keep whole masters and round what an op
// reads of them, which rounding a ZeRO unit's values again leaves
// unchanged, so ZeRO computes with the values one process does.
//
// Per parameter and rank (N ranks, P padded elements):
//
//	          params (copy)      grads        optimizer (masters + AdamW)
//	stage 1   2P                 4P           4P/N + 8Ψ/N
//	stage 2   2P                 4P/N + T     4P/N + 8Ψ/N
//	stage 3   2G                 4P/N + T     4P/N + 8Ψ/N
//
// with G, T as in doc.go, and 4G of widened parameters (communication)
// while units are in use. The all-gathers carry 2 bytes per element.

// layOutMixed gives u its buffers under mixed precision: the master shard,
// and in stages 1 and 2 the whole 2-byte copy. Values a caller built are
// broadcast from rank 0 as in layOut; the parameters keep no storage of
// their own.
func (z *Zero) layOutMixed(u *unitState, described bool) error {
	a := z.t.Alloc
	lo := z.lay.Lo(u.Unit)
	u.shard = a.New(tensor.Params, tensor.Float32, u.Shard)
	if z.stage <= 2 {
		u.copy = a.New(tensor.Params, z.half, u.Size)
	}
	if described {
		z.stale = true // the trainer fills the masters through Hold
		z.layOutGrads(u)
		return nil
	}
	flat := a.New(tensor.Comm, tensor.Float32, u.Size) // not a master: counted as communication
	for _, r := range u.Ranges {
		flat.Span(r.Offset, r.Offset+r.Numel).CopyFrom(r.Param)
	}
	err := z.run(u.g, "broadcast "+u.Name, flat.Bytes(), func() comm.Handle { return u.g.BroadcastAsync(flat, 0) })
	if err != nil {
		return fmt.Errorf("zero: broadcast of the initial parameters of unit %s: %w", u.Name, err)
	}
	u.shard.CopyFrom(flat.Span(lo, lo+u.Shard))
	if u.copy != nil {
		tensor.NarrowHalf(z.half, u.copy.U16(), flat.F32())
	}
	for _, r := range u.Ranges {
		r.Param.Alias(flat, r.Offset) // releases the parameter's own buffer
		r.Param.DropStorage()
	}
	flat.Release()
	z.layOutGrads(u)
	return nil
}

// startMixed makes u's float32 parameters for its use: in stages 1 and 2
// widened from the copy at once (nil: nothing in flight); in stage 3 the
// rounded shards are all-gathered into the 2-byte wire buffer, widened
// when the gather is waited for.
func (z *Zero) startMixed(u *unitState) *op {
	a := z.t.Alloc
	u.flat = a.NewUninit(tensor.Comm, tensor.Float32, u.Size)
	for _, r := range u.Ranges {
		r.Param.Alias(u.flat, r.Offset)
	}
	flat := u.flat
	if z.stage <= 2 {
		tensor.WidenHalf(z.half, flat.F32(), u.copy.U16())
		return nil
	}
	send := a.NewUninit(tensor.Comm, z.half, u.Shard)
	tensor.NarrowHalf(z.half, send.U16(), u.shard.F32())
	u.wire = a.NewUninit(tensor.Params, z.half, u.Size)
	wire := u.wire
	return z.issue(u.g, "all_gather "+u.Name, wire.Bytes(), func() comm.Handle { return u.g.AllGatherAsync(send, wire) }, func() {
		tensor.WidenHalf(z.half, flat.F32(), wire.U16())
		send.Release()
	})
}

// refresh brings the 2-byte copies of stages 1 and 2 up to the masters
// when they may predate them: each rank rounds its master shards into its
// ranges of the copies, and one all-gather per unit, in place, carries
// them to every rank. Every rank reaches it at the same point (the first
// unit gathered after a step or a load).
func (z *Zero) refresh() error {
	if !z.stale || z.stage == 3 {
		return nil
	}
	z.stale = false
	ops := make([]*op, len(z.units))
	for i, u := range z.units {
		lo := z.lay.Lo(u.Unit)
		mine := u.copy.Span(lo, lo+u.Shard)
		tensor.NarrowHalf(z.half, mine.U16(), u.shard.F32())
		ops[i] = z.issue(u.g, "all_gather "+u.Name, u.copy.Bytes(), func() comm.Handle { return u.g.AllGatherAsync(mine, u.copy) }, nil)
	}
	for i, o := range ops {
		if err := o.wait(); err != nil {
			return fmt.Errorf("all-gather of the 2-byte copies of unit %s: %w", z.units[i].Name, err)
		}
	}
	return nil
}
