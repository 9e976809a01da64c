package comm

import (
	"github.com/tinyacc/tinyacc/core/tensor"
)

// Collectives of float32 tensors carried in another dtype: under mixed
// precision activations travel between pipeline stages and through the
// tensor- and context-parallel exchanges in the compute dtype (bfloat16 or
// float16), half the bytes of float32. Each helper rounds the float32
// tensor into a half buffer (to nearest even), runs the collective on it
// (a reduction sums in float32 and rounds once, half.go) and widens the
// result back into the float32 tensor, which is what the receiver computes
// with. With d = Float32, or a tensor that is not float32, they are the
// plain collective.

// carried reports whether a float32 tensor x travels as d.
func carried(x *tensor.Tensor, d tensor.DType) bool {
	return x.DType() == tensor.Float32 && (d == tensor.BFloat16 || d == tensor.Float16)
}

// toWire returns x rounded to d in a new communication buffer.
func toWire(x *tensor.Tensor, d tensor.DType) *tensor.Tensor {
	w := tensor.Default.NewUninit(tensor.Comm, d, x.Numel())
	tensor.NarrowHalf(d, w.U16(), x.F32())
	return w
}

// fromWire widens w into the float32 x and gives w back.
func fromWire(x, w *tensor.Tensor) {
	tensor.WidenHalf(w.DType(), x.F32(), w.U16())
	w.Release()
}

// SendAs is g.Send of the float32 t carried as d.
func SendAs(g Group, t *tensor.Tensor, to int, d tensor.DType) error {
	if !carried(t, d) {
		return g.Send(t, to)
	}
	w := toWire(t, d)
	defer w.Release()
	return g.Send(w, to)
}

// RecvAs is g.Recv into the float32 t of a tensor sent as d (SendAs).
func RecvAs(g Group, t *tensor.Tensor, from int, d tensor.DType) error {
	if !carried(t, d) {
		return g.Recv(t, from)
	}
	w := tensor.Default.NewUninit(tensor.Comm, d, t.Numel())
	if err := g.Recv(w, from); err != nil {
		w.Release()
		return err
	}
	fromWire(t, w)
	return nil
}

// AllReduceAs is g.AllReduce of the float32 t carried as d: every rank's
// t rounded to d, summed in float32 and rounded once, widened back.
func AllReduceAs(g Group, t *tensor.Tensor, op ReduceOp, d tensor.DType) error {
	if !carried(t, d) {
		return g.AllReduce(t, op)
	}
	w := toWire(t, d)
	if err := g.AllReduce(w, op); err != nil {
		w.Release()
		return err
	}
	fromWire(t, w)
	return nil
}

// AllGatherAs is g.AllGather of the float32 in into out carried as d.
func AllGatherAs(g Group, in, out *tensor.Tensor, d tensor.DType) error {
	if !carried(in, d) {
		return g.AllGather(in, out)
	}
	w := toWire(in, d)
	defer w.Release()
	all := tensor.Default.NewUninit(tensor.Comm, d, out.Numel())
	if err := g.AllGather(w, all); err != nil {
		all.Release()
		return err
	}
	fromWire(out, all)
	return nil
}

// ReduceScatterAs is g.ReduceScatter of the float32 in into out carried
// as d.
func ReduceScatterAs(g Group, in, out *tensor.Tensor, op ReduceOp, d tensor.DType) error {
	if !carried(in, d) {
		return g.ReduceScatter(in, out, op)
	}
	w := toWire(in, d)
	defer w.Release()
	mine := tensor.Default.NewUninit(tensor.Comm, d, out.Numel())
	if err := g.ReduceScatter(w, mine, op); err != nil {
		mine.Release()
		return err
	}
	fromWire(out, mine)
	return nil
}
