package tensor

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/tensor/cpu"
)

// Linear returns x·w + b for x of shape [..., in], w of shape [in, out] (the
// Hugging Face GPT-2 Conv1D layout) and an optional bias b of shape [out].
//
// Its backward computes the input gradient at once and, when the pass defers
// weight gradients (zero-bubble pipelines), queues w's and b's gradients.
func Linear(x, w, b *Tensor) *Tensor {
	checkFloat("Linear", x, w, b)
	in := x.Dim(-1)
	if len(w.shape) != 2 || w.shape[0] != in || (b != nil && b.Numel() != w.shape[1]) {
		bs := "none"
		if b != nil {
			bs = fmt.Sprint(b.shape)
		}
		panic(fmt.Sprintf("tensor: Linear of input %v with weight %v and bias %s", x.shape, w.shape, bs))
	}
	out := w.shape[1]
	rows := x.Numel() / in
	shape := append(clone(x.shape[:len(x.shape)-1]), out)
	y := like(x, shape...)
	d := computeOf(x) // precision.go
	if x.dtype == Float32 {
		var bias []float32
		done := func() {}
		if b != nil {
			var bv *Tensor
			bv, done = ReadParam(b) // the bias's copy (precision.go)
			bias = bv.f32
		}
		gemmDBias(d, rows, out, in, halfInput(d, x), operandOf(d, w), bias, y.f32)
		done()
	} else {
		linearFwd(x.f64, w.f64, biasOf[float64](b), y.f64, rows, in, out)
	}
	record(y, "linear", func(bp *Backprop, g *Tensor) []*Tensor {
		var gx, gw, gb *Tensor
		deferW := bp.DeferringWeights() && w.node == nil
		// both products read g: round it once (precision.go)
		gop, done := roundOnce(d, g.f32, rows, out, x.dtype == Float32 && x.requiresGrad && w.requiresGrad && !deferW)
		defer done()
		if x.requiresGrad {
			gx = like(x, x.shape...)
			if x.dtype == Float32 {
				gemmD(d, false, true, rows, in, out, gop, out, operandOf(d, w), out, 0, gx.f32, in)
			} else {
				cpu.Gemm(false, true, rows, in, out, 1, g.f64, out, w.f64, out, 0, gx.f64, in)
			}
		}
		weightGrad := func() *Tensor {
			gw, beta, ret := gradBuffer(bp, w)
			if x.dtype == Float32 {
				gemmD(d, true, false, in, out, rows, operandOf(d, x), in, gop, out, float32(beta), gw.f32, out)
			} else {
				cpu.Gemm(true, false, in, out, rows, 1, x.f64, in, g.f64, out, beta, gw.f64, out)
			}
			return ret
		}
		biasGrad := func() *Tensor {
			gb, _, ret := gradBuffer(bp, b)
			if x.dtype == Float32 {
				cpu.BiasGrad(g.f32, gb.f32, rows, out)
			} else {
				cpu.BiasGrad(g.f64, gb.f64, rows, out)
			}
			return ret
		}
		if w.requiresGrad {
			if deferW {
				bp.Defer(w, weightGrad)
			} else {
				gw = weightGrad()
			}
		}
		if b != nil && b.requiresGrad {
			if deferW && b.node == nil {
				bp.Defer(b, biasGrad)
			} else {
				gb = biasGrad()
			}
		}
		return []*Tensor{gx, gw, gb}
	}, x, w, b)
	outUnread(y)
	halfReads(y)
	return y
}

// gradBuffer is where an op adds its contribution to the gradient of
// input t: the leaf's own Grad (GEMMs accumulate into it with beta 1, and
// the op returns accumulated), or else a fresh zeroed buffer the op
// returns (beta 0 overwrites it).
func gradBuffer(bp *Backprop, t *Tensor) (buf *Tensor, beta float64, ret *Tensor) {
	if buf = bp.leafGrad(t); buf != nil {
		return buf, 1, accumulated
	}
	buf = zerosLike(t, t.shape...)
	return buf, 0, buf
}

func biasOf[T cpu.Float](b *Tensor) []T {
	if b == nil {
		return nil
	}
	return data[T](b)
}

func linearFwd[T cpu.Float](x, w, b, y []T, rows, in, out int) {
	cpu.Gemm(false, false, rows, out, in, 1, x, in, w, out, 0, y, out)
	if b != nil {
		cpu.AddBias(y, b, rows, out)
	}
}

// MatMulT returns x·wᵀ for x of shape [..., in] and w of shape [out, in]:
// the GPT-2 output head, which reuses the token embedding table [V, C].
// Like Linear, it can defer its weight gradient. Its backward computes
// x's gradient, its last read of w, before it asks for w's gradient
// buffer (BackwardOptions.NeedGrad), so the owner of a gathered w (ZeRO-3)
// may release w's values there and give the gradient their storage. Its
// backward does not read its output, the logits, so they go before it
// runs: the cross-entropy's backward, their last reader, has run.
func MatMulT(x, w *Tensor) *Tensor {
	checkFloat("MatMulT", x, w)
	in := x.Dim(-1)
	if len(w.shape) != 2 || w.shape[1] != in {
		panic(fmt.Sprintf("tensor: MatMulT of input %v with weight %v", x.shape, w.shape))
	}
	out := w.shape[0]
	rows := x.Numel() / in
	shape := append(clone(x.shape[:len(x.shape)-1]), out)
	y := like(x, shape...)
	d := computeOf(x) // precision.go
	if x.dtype == Float32 {
		gemmD(d, false, true, rows, out, in, f32Operand(x.f32), in, operandOf(d, w), in, 0, y.f32, out)
	} else {
		cpu.Gemm(false, true, rows, out, in, 1, x.f64, in, w.f64, in, 0, y.f64, out)
	}
	record(y, "matmul_t", func(bp *Backprop, g *Tensor) []*Tensor {
		var gx, gw *Tensor
		deferW := bp.DeferringWeights() && w.node == nil
		// both products read g: round it once (precision.go)
		gop, done := roundOnce(d, g.f32, rows, out, x.dtype == Float32 && x.requiresGrad && w.requiresGrad && !deferW)
		defer done()
		if x.requiresGrad {
			gx = like(x, x.shape...)
			if x.dtype == Float32 {
				gemmD(d, false, false, rows, in, out, gop, out, operandOf(d, w), in, 0, gx.f32, in)
			} else {
				cpu.Gemm(false, false, rows, in, out, 1, g.f64, out, w.f64, in, 0, gx.f64, in)
			}
		}
		weightGrad := func() *Tensor {
			gw, beta, ret := gradBuffer(bp, w)
			if x.dtype == Float32 {
				gemmD(d, true, false, out, in, rows, gop, out, operandOf(d, x), in, float32(beta), gw.f32, in)
			} else {
				cpu.Gemm(true, false, out, in, rows, 1, g.f64, out, x.f64, in, beta, gw.f64, in)
			}
			return ret
		}
		if w.requiresGrad {
			if deferW {
				bp.Defer(w, weightGrad)
			} else {
				gw = weightGrad()
			}
		}
		return []*Tensor{gx, gw}
	}, x, w)
	outUnread(y)
	halfReads(y)
	return y
}
