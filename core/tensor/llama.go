package tensor

import (
	"fmt"
	"math"

	"github.com/tinyacc/tinyacc/core/tensor/cpu"
)

// The kernels of the Llama family beside GPT-2's: RMSNorm, rotary position
// embeddings, the SwiGLU gate (SiluMul) and linear maps with weights in
// the [out, in] layout of Hugging Face's nn.Linear (LinearT). Grouped-query
// attention is in llama_attention.go.

// RMSNorm normalises x over its last dimension by its root mean square and
// scales by w: y = x / sqrt(mean(x²) + eps) * w.
func RMSNorm(x, w *Tensor, eps float64) *Tensor {
	checkFloat("RMSNorm", x, w)
	C := x.Dim(-1)
	if w.Numel() != C {
		panic(fmt.Sprintf("tensor: RMSNorm of %v with weight %v", x.shape, w.shape))
	}
	rows := x.Numel() / C
	out := like(x, x.shape...)
	rstd := like(x, rows)
	var hx, hy *Tensor // the copies StoreHalf takes (early.go)
	if x.dtype == Float32 {
		wv, done := ReadParam(w) // the weight's copy (precision.go)
		hx, hy = earlyHalf(x, false), earlyHalf(out, x.requiresGrad || w.requiresGrad)
		if hx == nil && hy == nil {
			cpu.RMSNormForward(x.f32, wv.f32, out.f32, rstd.f32, rows, C, eps)
		} else {
			cpu.RMSNormForwardHalf(isF16(hx) || isF16(hy), x.f32, wv.f32, out.f32, rstd.f32, rows, C, eps, halfBits(hx), halfBits(hy))
		}
		done()
	} else {
		cpu.RMSNormForward(x.f64, w.f64, out.f64, rstd.f64, rows, C, eps)
	}
	record(out, "rmsnorm", func(_ *Backprop, g *Tensor) []*Tensor {
		gx, gw := zerosLike(x, x.shape...), zerosLike(w, w.shape...)
		if x.dtype == Float32 {
			wv, done := ReadParam(w)
			if h := storedHalf(x); h != nil { // widened a block at a time (node.readsHalf)
				cpu.RMSNormBackwardHalf(h.dtype == Float16, g.f32, h.u16, wv.f32, rstd.f32, gx.f32, gw.f32, rows, C)
			} else {
				cpu.RMSNormBackward(g.f32, x.f32, wv.f32, rstd.f32, gx.f32, gw.f32, rows, C)
			}
			done()
		} else {
			cpu.RMSNormBackward(g.f64, x.f64, w.f64, rstd.f64, gx.f64, gw.f64, rows, C)
		}
		return []*Tensor{gx, gw}
	}, x, w)
	if out.node != nil {
		saveBuf(out, rstd)
	} else {
		rstd.Release()
	}
	halfReads(out)
	setRefill(out, func(out *Tensor) {
		// The same kernel on the same input: bitwise the dropped output
		// (the statistics, equal to the kept ones, are left alone).
		r := like(x, rows)
		if x.dtype == Float32 {
			wv, done := ReadParam(w)
			cpu.RMSNormForward(x.f32, wv.f32, out.f32, r.f32, rows, C, eps)
			done()
		} else {
			cpu.RMSNormForward(x.f64, w.f64, out.f64, r.f64, rows, C, eps)
		}
		r.Release()
	})
	outUnread(out)
	keepEarly(x, hx)
	keepEarly(out, hy)
	return out
}

// Rotary position embeddings, in Hugging Face's convention (rotate_half):
// in a head of hs dimensions, dimension d < hs/2 pairs with d + hs/2, and
// the pair of a row at global position p turns by the angle p·θ^(-2d/hs):
//
//	out[d]      = x[d] cos - x[d+hs/2] sin
//	out[d+hs/2] = x[d+hs/2] cos + x[d] sin
//
// The angle follows the row's global position, not its index, so a
// context-parallel rank's rows (a zigzag split's two chunks) turn as they
// do in the whole sequence. The angles are computed in float64 whatever
// the dtype.

// ropeTable holds cos and sin of each row's angles, [T, hs/2] each.
type ropeTable struct {
	half     int
	cos, sin []float64
}

func newRopeTable(pos []int, T, hs int, theta float64) ropeTable {
	half := hs / 2
	tb := ropeTable{half: half, cos: make([]float64, T*half), sin: make([]float64, T*half)}
	inv := make([]float64, half)
	for d := range inv {
		inv[d] = 1 / math.Pow(theta, float64(2*d)/float64(hs))
	}
	for t := 0; t < T; t++ {
		p := float64(position(pos, t))
		for d, f := range inv {
			tb.sin[t*half+d], tb.cos[t*half+d] = math.Sincos(p * f)
		}
	}
	return tb
}

// rotate turns the heads of n columns starting at col of every row of x
// into y (sign -1: the inverse turn, the backward). Rows are [B·T, ld].
func rotate[F cpu.Float](tb ropeTable, x, y []F, rows, T, ld, col, n int, sign float64) {
	cpu.RopeRotate(x, y, rows, T, ld, col, n, tb.half, tb.cos, tb.sin, sign)
}

// RoPE rotates the q and k heads of a fused qkv [B, T, (nHead+2·nKV)·hs]
// (q heads, then k heads, then v heads) whose rows sit at global
// positions pos (nil: 0..T-1); the v columns pass unchanged.
func RoPE(qkv *Tensor, nHead, nKV int, pos []int, theta float64) *Tensor {
	checkFloat("RoPE", qkv)
	if nHead < 1 || nKV < 1 || len(qkv.shape) != 3 || qkv.shape[2]%(nHead+2*nKV) != 0 || (qkv.shape[2]/(nHead+2*nKV))%2 != 0 {
		panic(fmt.Sprintf("tensor: RoPE input %v does not split into %d q and %d k, v heads of an even size", qkv.shape, nHead, nKV))
	}
	B, T, W := qkv.shape[0], qkv.shape[1], qkv.shape[2]
	if pos != nil && len(pos) != T {
		panic(fmt.Sprintf("tensor: RoPE of %d rows with %d positions", T, len(pos)))
	}
	hs := W / (nHead + 2*nKV)
	tb := newRopeTable(pos, T, hs, theta)
	n, rows := (nHead+nKV)*hs, B*T
	out := like(qkv, qkv.shape...)
	if qkv.dtype == Float32 {
		rotate(tb, qkv.f32, out.f32, rows, T, W, 0, n, 1)
	} else {
		rotate(tb, qkv.f64, out.f64, rows, T, W, 0, n, 1)
	}
	copyCols(out, n, qkv, n, W-n, rows)
	record(out, "rope", func(_ *Backprop, g *Tensor) []*Tensor {
		gx := like(g, g.shape...)
		if g.dtype == Float32 {
			rotate(tb, g.f32, gx.f32, rows, T, W, 0, n, -1)
		} else {
			rotate(tb, g.f64, gx.f64, rows, T, W, 0, n, -1)
		}
		copyCols(gx, n, g, n, W-n, rows)
		return []*Tensor{gx}
	}, qkv)
	return out
}

// SiluMul is the SwiGLU gate of a fused gate|up [..., 2I] (the gate in the
// first I columns, up in the last I): silu(gate)·up, [..., I], where
// silu(g) = g·sigmoid(g).
func SiluMul(gu *Tensor) *Tensor {
	checkFloat("SiluMul", gu)
	W := gu.Dim(-1)
	if W%2 != 0 {
		panic(fmt.Sprintf("tensor: SiluMul of %v: the last dimension must hold gate and up halves", gu.shape))
	}
	I, rows := W/2, gu.Numel()/W
	out := like(gu, append(clone(gu.shape[:len(gu.shape)-1]), I)...)
	if gu.dtype == Float32 {
		cpu.SiluMulForward(gu.f32, out.f32, rows, I)
	} else {
		cpu.SiluMulForward(gu.f64, out.f64, rows, I)
	}
	record(out, "silu_mul", func(_ *Backprop, g *Tensor) []*Tensor {
		gx := like(gu, gu.shape...)
		if h := storedHalf(gu); h != nil && gu.dtype == Float32 { // widened a chunk at a time (node.readsHalf)
			cpu.SiluMulBackwardHalf(h.dtype == Float16, h.u16, g.f32, gx.f32, rows, I)
		} else if gu.dtype == Float32 {
			cpu.SiluMulBackward(gu.f32, g.f32, gx.f32, rows, I)
		} else {
			cpu.SiluMulBackward(gu.f64, g.f64, gx.f64, rows, I)
		}
		return []*Tensor{gx}
	}, gu)
	setRefill(out, func(out *Tensor) {
		if gu.dtype == Float32 {
			cpu.SiluMulForward(gu.f32, out.f32, rows, I)
		} else {
			cpu.SiluMulForward(gu.f64, out.f64, rows, I)
		}
	})
	outUnread(out)
	halfReads(out)
	return out
}

// LinearT returns x·w₁ᵀ | x·w₂ᵀ | … for x [..., in] and weights wᵢ [outᵢ,
// in] (nn.Linear's layout, no bias): the products side by side in one
// tensor [..., Σ outᵢ]. Llama's q, k and v projections run as one such
// call, as do its gate and up projections. Like Linear, it can defer its
// weight gradients (zero-bubble pipelines).
func LinearT(x *Tensor, ws ...*Tensor) *Tensor {
	checkFloat("LinearT", append([]*Tensor{x}, ws...)...)
	in := x.Dim(-1)
	offs := make([]int, len(ws)+1)
	for i, w := range ws {
		if len(w.shape) != 2 || w.shape[1] != in {
			panic(fmt.Sprintf("tensor: LinearT of input %v with weight %v", x.shape, w.shape))
		}
		offs[i+1] = offs[i] + w.shape[0]
	}
	O, rows := offs[len(ws)], x.Numel()/in
	y := like(x, append(clone(x.shape[:len(x.shape)-1]), O)...)
	d := computeOf(x) // precision.go
	var xo cpu.HalfOperand
	if x.dtype == Float32 {
		xo = halfInput(d, x) // read by every weight's product, narrowed at most once
	}
	for i, w := range ws {
		if x.dtype == Float32 {
			gemmD(d, false, true, rows, w.shape[0], in, xo, in, operandOf(d, w), in, 0, y.f32[offs[i]:], O)
		} else {
			cpu.Gemm(false, true, rows, w.shape[0], in, 1, x.f64, in, w.f64, in, 0, y.f64[offs[i]:], O)
		}
	}
	inputs := append([]*Tensor{x}, ws...)
	record(y, "linear_t", func(bp *Backprop, g *Tensor) []*Tensor {
		grads := make([]*Tensor, len(inputs))
		// the input's and the weights' gradients read g: round it once
		// (precision.go)
		gop, done := roundOnce(d, g.f32, rows, O, x.dtype == Float32 && x.requiresGrad && !bp.DeferringWeights())
		defer done()
		if x.requiresGrad {
			gx := like(x, x.shape...)
			for i, w := range ws {
				beta := float64(min(i, 1))
				if x.dtype == Float32 {
					gemmD(d, false, false, rows, in, w.shape[0], gop.Strip(offs[i]), O, operandOf(d, w), in, float32(beta), gx.f32, in)
				} else {
					cpu.Gemm(false, false, rows, in, w.shape[0], 1, g.f64[offs[i]:], O, w.f64, in, beta, gx.f64, in)
				}
			}
			grads[0] = gx
		}
		for i, w := range ws {
			if !w.requiresGrad {
				continue
			}
			weightGrad := func() *Tensor {
				gw, beta, ret := gradBuffer(bp, w) // in place into w's gradient
				if x.dtype == Float32 {
					gemmD(d, true, false, w.shape[0], in, rows, gop.Strip(offs[i]), O, operandOf(d, x), in, float32(beta), gw.f32, in)
				} else {
					cpu.Gemm(true, false, w.shape[0], in, rows, 1, g.f64[offs[i]:], O, x.f64, in, beta, gw.f64, in)
				}
				return ret
			}
			if bp.DeferringWeights() && w.node == nil {
				bp.Defer(w, weightGrad)
			} else {
				grads[i+1] = weightGrad()
			}
		}
		return grads
	}, inputs...)
	outUnread(y)
	halfReads(y) // the weights' gradients read x's 2-byte copy as stored
	return y
}
