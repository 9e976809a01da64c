package cp

import (
	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
	"github.com/tinyacc/tinyacc/core/trace"
)

// All-gather attention, the naive form beside the ring: every rank
// all-gathers the keys and values of the whole sequence over the group,
// attends its queries to each rank's block (merged through the log-sum-exp,
// as the ring does) and keeps the gathered blocks for the backward, which
// computes every block's dK and dV locally and reduce-scatters them, so
// each rank receives the sum of the gradients of its own keys and values.
//
// One collective each way and no ordering to get right, at the price of
// memory: the keys and values of the whole sequence, 2·B·T·C per layer,
// live from forward to backward, where the ring holds two blocks at a
// time.

type gatherFn struct{ a *Attention }

func (f *gatherFn) Forward(ctx *tensor.FuncCtx, in ...*tensor.Tensor) (*tensor.Tensor, error) {
	if in[0].DType() == tensor.Float32 {
		return gatherForward[float32](f.a, ctx, in[0])
	}
	return gatherForward[float64](f.a, ctx, in[0])
}

func (f *gatherFn) Backward(ctx *tensor.FuncCtx, g *tensor.Tensor) ([]*tensor.Tensor, error) {
	var gq *tensor.Tensor
	var err error
	if g.DType() == tensor.Float32 {
		gq, err = gatherBackward[float32](f.a, ctx, g)
	} else {
		gq, err = gatherBackward[float64](f.a, ctx, g)
	}
	return []*tensor.Tensor{gq}, err
}

func gatherForward[F cpu.Float](a *Attention, ctx *tensor.FuncCtx, qkv *tensor.Tensor) (*tensor.Tensor, error) {
	B, T, C, err := a.shape(qkv)
	if err != nil {
		return nil, err
	}
	n, r, al, dt := a.G.Size(), a.G.Rank(), a.alloc(), qkv.DType()
	blk := B * T * C.KV2
	kv := al.NewUninit(tensor.Comm, dt, B, T, C.KV2)
	pack(vals[F](qkv), vals[F](kv), B*T, C)
	all := al.NewUninit(tensor.Activations, dt, n*blk) // kept for backward
	wd := al.Compute()                                 // under mixed precision the blocks travel in bf16/fp16
	span := a.Trace.Begin("cp all_gather kv", "comm", trace.Comm).With("bytes", wireBytes(all, wd)).With("group", a.G.Name())
	err = comm.AllGatherAs(a.G, kv, all, wd)
	span.End()
	kv.Release()
	if err != nil {
		all.Release()
		return nil, a.errorf("all-gather of keys and values", err)
	}
	d := C.dims(B, T, tensor.HalfProducts(qkv))
	out := al.New(tensor.Activations, dt, B, T, C.Q)
	lse := al.New(tensor.Activations, dt, B, a.NHead, T)
	tmpOut := al.NewUninit(tensor.Activations, dt, B, T, C.Q)
	tmpLse := al.NewUninit(tensor.Activations, dt, B, a.NHead, T)
	q, xs := vals[F](qkv), vals[F](all)
	qpos := a.Pos[r]
	// Own block first (it is never in the future), then the others in
	// the ring's order.
	for s := 0; s < n; s++ {
		j := (r - s + n) % n
		if future(qpos, a.Pos[j]) {
			a.skipped()
			continue
		}
		a.compute("block", s, j, int64(B)*Pairs(qpos, a.Pos[j]), func() {
			attend(d, q, xs[j*blk:(j+1)*blk], qpos, a.Pos[j], vals[F](out), vals[F](lse), vals[F](tmpOut), vals[F](tmpLse), s == 0)
		})
	}
	tmpOut.Release()
	tmpLse.Release()
	ctx.Save(qkv)
	ctx.Own(lse, all)
	ctx.Values["out"], ctx.Values["lse"], ctx.Values["all"] = out, lse, all
	return out, nil
}

func gatherBackward[F cpu.Float](a *Attention, ctx *tensor.FuncCtx, gout *tensor.Tensor) (*tensor.Tensor, error) {
	qkv := ctx.Saved()[0]
	out, lse, all := ctx.Values["out"].(*tensor.Tensor), ctx.Values["lse"].(*tensor.Tensor), ctx.Values["all"].(*tensor.Tensor)
	B, T, C, _ := a.shape(qkv)
	n, r, al, dt := a.G.Size(), a.G.Rank(), backAlloc(ctx), qkv.DType()
	blk := B * T * C.KV2
	d := C.dims(B, T, tensor.HalfProducts(qkv))
	gq := al.New(tensor.Activations, dt, B, T, C.W)
	delta := al.NewUninit(tensor.Activations, dt, B, a.NHead, T)
	defer delta.Release()
	cpu.AttentionDelta(d, vals[F](gout), vals[F](out), vals[F](delta))
	dall := al.New(tensor.Comm, dt, n*blk)
	defer dall.Release()
	q, xs, dxs := vals[F](qkv), vals[F](all), vals[F](dall)
	qpos := a.Pos[r]
	for s := 0; s < n; s++ {
		j := (r - s + n) % n
		if future(qpos, a.Pos[j]) {
			continue
		}
		a.compute("block backward", s, j, 0, func() {
			attendBack(d, vals[F](gout), q, xs[j*blk:(j+1)*blk], vals[F](delta), vals[F](lse), qpos, a.Pos[j], vals[F](gq), dxs[j*blk:(j+1)*blk])
		})
	}
	mine := al.NewUninit(tensor.Comm, dt, blk)
	defer mine.Release()
	wd := al.Compute()
	span := a.Trace.Begin("cp reduce_scatter dkv", "comm", trace.Comm).With("bytes", wireBytes(dall, wd)).With("group", a.G.Name())
	err := comm.ReduceScatterAs(a.G, dall, mine, comm.Sum, wd)
	span.End()
	if err != nil {
		gq.Release()
		return nil, a.errorf("reduce-scatter of the key and value gradients", err)
	}
	unpackAdd(vals[F](mine), vals[F](gq), B*T, C)
	return gq, nil
}

// wireBytes is what the float32 buffer t weighs carried in dtype d.
func wireBytes(t *tensor.Tensor, d tensor.DType) int64 {
	if t.DType() != tensor.Float32 {
		return t.Bytes()
	}
	return int64(t.Numel()) * int64(d.Size())
}
