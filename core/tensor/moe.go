package tensor

import (
	"fmt"
	"math"

	"github.com/tinyacc/tinyacc/core/tensor/cpu"
)

// The ops of a mixture-of-experts layer: the router's softmax, the gather
// that hands an expert its tokens, the weights of the chosen experts
// renormalised over them, the weighted sum that brings the experts'
// outputs back, and the router's two auxiliary losses. Which token goes
// where is decided by the caller (nn.MoE) from the probabilities' values;
// these ops only move rows and carry gradients.

// SoftmaxRows returns the softmax over the last dimension of x.
func SoftmaxRows(x *Tensor) *Tensor {
	checkFloat("SoftmaxRows", x)
	E := x.Dim(-1)
	rows := x.Numel() / E
	out := like(x, x.shape...)
	for r := 0; r < rows; r++ {
		m := math.Inf(-1)
		for j := 0; j < E; j++ {
			m = math.Max(m, x.At(r*E+j))
		}
		var s float64
		for j := 0; j < E; j++ {
			e := math.Exp(x.At(r*E+j) - m)
			out.Set(r*E+j, e)
			s += e
		}
		for j := 0; j < E; j++ {
			out.Set(r*E+j, out.At(r*E+j)/s)
		}
	}
	record(out, "softmax", func(_ *Backprop, g *Tensor) []*Tensor {
		gx := like(x, x.shape...)
		for r := 0; r < rows; r++ {
			var dot float64
			for j := 0; j < E; j++ {
				dot += g.At(r*E+j) * out.At(r*E+j)
			}
			for j := 0; j < E; j++ {
				gx.Set(r*E+j, out.At(r*E+j)*(g.At(r*E+j)-dot))
			}
		}
		return []*Tensor{gx}
	}, x)
	// The backward reads the probabilities beside the identity their
	// float32 values hold (each row sums to one), so they stay float32
	// under mixed precision: see exactOutput.
	exactOutput(out)
	return out
}

// exactOutput keeps out, whose op's backward reads it, float32 under
// mixed precision (StoreHalf passes it by). The router's softmax and its
// renormalised weights are such outputs: each backward is a difference
// of near-equal terms (g_j - Σ g·p, g_j - Σ g·w) that is exact only while
// the row sums to one. Rounded to 2 bytes the row no longer does, and
// the backward leaves an error of 2^-8 of the incoming gradient in the
// router's gradient, a large share of it where the experts' outputs are
// alike, in the direction softmax cannot see
// (TestStoreHalfKeepsRouterRowsExact).
// Both tensors are [N, experts] and [N, top_k]: keeping them costs
// nothing beside the experts' rows.
func exactOutput(out *Tensor) {
	if out.node != nil {
		out.node.exact = true
	}
}

// GatherRows returns the rows of x [N, C] listed in rows, in that order
// ([len(rows), C]); the backward adds each row's gradient back into its
// source row.
func GatherRows(x *Tensor, rows []int) *Tensor {
	checkFloat("GatherRows", x)
	C := x.Dim(-1)
	n := x.Numel() / C
	for _, r := range rows {
		if r < 0 || r >= n {
			panic(fmt.Sprintf("tensor: GatherRows of row %d from %d rows", r, n))
		}
	}
	out := like(x, len(rows), C)
	if x.dtype == Float32 {
		gatherRows(data[float32](x), data[float32](out), rows, C)
	} else {
		gatherRows(data[float64](x), data[float64](out), rows, C)
	}
	record(out, "gather_rows", func(_ *Backprop, g *Tensor) []*Tensor {
		gx := zerosLike(x, x.shape...)
		if x.dtype == Float32 {
			scatterAddRows(data[float32](g), data[float32](gx), rows, nil, C)
		} else {
			scatterAddRows(data[float64](g), data[float64](gx), rows, nil, C)
		}
		return []*Tensor{gx}
	}, x)
	return out
}

func gatherRows[T cpu.Float](x, out []T, rows []int, C int) {
	for j, r := range rows {
		copy(out[j*C:(j+1)*C], x[r*C:(r+1)*C])
	}
}

// scatterAddRows adds w[j]·src row j into dst row rows[j] (w nil: 1).
func scatterAddRows[T cpu.Float](src, dst []T, rows []int, w []T, C int) {
	for j, r := range rows {
		a := T(1)
		if w != nil {
			a = w[j]
		}
		cpu.Axpy(a, src[j*C:(j+1)*C], dst[r*C:(r+1)*C])
	}
}

// RoutedWeights returns the weights of each row's chosen columns of p
// [N, E] (choice holds k column indices per row, row-major), renormalised
// to sum to one over the k: w[t,s] = p[t,c_s] / Σ_s' p[t,c_s'], [N, k].
func RoutedWeights(p *Tensor, choice []int, k int) *Tensor {
	checkFloat("RoutedWeights", p)
	E := p.Dim(-1)
	N := p.Numel() / E
	if len(choice) != N*k {
		panic(fmt.Sprintf("tensor: RoutedWeights of %d rows with %d choices for k=%d", N, len(choice), k))
	}
	out := like(p, N, k)
	sums := make([]float64, N)
	for t := 0; t < N; t++ {
		for s := 0; s < k; s++ {
			sums[t] += p.At(t*E + choice[t*k+s])
		}
		for s := 0; s < k; s++ {
			out.Set(t*k+s, p.At(t*E+choice[t*k+s])/sums[t])
		}
	}
	record(out, "routed_weights", func(_ *Backprop, g *Tensor) []*Tensor {
		// dw[s]/dp[c_j] = δ_sj/S - p[c_s]/S², so
		// gp[c_j] = g[j]/S - Σ_s g[s]·w[s]/S.
		gp := zerosLike(p, p.shape...)
		for t := 0; t < N; t++ {
			var dot float64
			for s := 0; s < k; s++ {
				dot += g.At(t*k+s) * out.At(t*k+s)
			}
			for s := 0; s < k; s++ {
				i := t*E + choice[t*k+s]
				gp.Set(i, gp.At(i)+(g.At(t*k+s)-dot)/sums[t])
			}
		}
		return []*Tensor{gp}
	}, p)
	exactOutput(out) // its backward reads w beside Σ w = 1
	return out
}

// Routed is one expert's share of a combine: its output rows Y
// [len(Rows), C], the token each row belongs to, and the index into the
// routing weights (t·k + s) that scales it.
type Routed struct {
	Y      *Tensor
	Rows   []int
	Weight []int
}

// CombineRows returns out [n, C] with out[Rows[j]] = Σ w[Weight[j]]·Y[j]
// over every expert's rows: the experts' outputs weighted by the router
// and added back at their tokens. w is RoutedWeights' [N, k] output (as
// a flat list of weights); a token no expert row names gets zeros.
func CombineRows(n int, w *Tensor, parts []Routed) *Tensor {
	checkFloat("CombineRows", w)
	if len(parts) == 0 {
		panic("tensor: CombineRows needs at least one expert's rows")
	}
	C := parts[0].Y.Dim(-1)
	out := zerosLike(parts[0].Y, n, C)
	inputs := []*Tensor{w}
	for _, p := range parts {
		checkFloat("CombineRows", w, p.Y)
		if p.Y.Numel() != len(p.Rows)*C || len(p.Weight) != len(p.Rows) {
			panic(fmt.Sprintf("tensor: CombineRows part %v with %d rows and %d weights", p.Y.shape, len(p.Rows), len(p.Weight)))
		}
		ws := make([]float64, len(p.Rows))
		for j, i := range p.Weight {
			ws[j] = w.At(i)
		}
		if w.dtype == Float32 {
			scatterAddRows(data[float32](p.Y), data[float32](out), p.Rows, f32s(ws), C)
		} else {
			scatterAddRows(data[float64](p.Y), data[float64](out), p.Rows, ws, C)
		}
		inputs = append(inputs, p.Y)
	}
	record(out, "combine_rows", func(_ *Backprop, g *Tensor) []*Tensor {
		gw := zerosLike(w, w.shape...)
		grads := []*Tensor{gw}
		for _, p := range parts {
			gy := like(p.Y, p.Y.shape...)
			for j, r := range p.Rows {
				var dot float64
				for c := 0; c < C; c++ {
					gv := g.At(r*C + c)
					dot += gv * p.Y.At(j*C+c)
					gy.Set(j*C+c, gv*w.At(p.Weight[j]))
				}
				gw.Set(p.Weight[j], gw.At(p.Weight[j])+dot)
			}
			grads = append(grads, gy)
		}
		return grads
	}, inputs...)
	return out
}

func f32s(v []float64) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out
}

// RouterAuxLoss is the load-balancing loss's node: a one-element tensor
// holding value whose gradient with respect to the router probabilities p
// [N, E] is colGrad[i] in every row of column i. The caller computes both
// from statistics that may span ranks (the value is the global loss, the
// gradient this rank's share of it), which is why they are given.
func RouterAuxLoss(p *Tensor, colGrad []float64, value float64) *Tensor {
	checkFloat("RouterAuxLoss", p)
	E := p.Dim(-1)
	if len(colGrad) != E {
		panic(fmt.Sprintf("tensor: RouterAuxLoss of %v with %d column gradients", p.shape, len(colGrad)))
	}
	out := like(p, 1)
	out.Set(0, value)
	record(out, "router_aux_loss", func(_ *Backprop, g *Tensor) []*Tensor {
		gp := like(p, p.shape...)
		gv := g.At(0)
		for i := 0; i < p.Numel(); i++ {
			gp.Set(i, gv*colGrad[i%E])
		}
		return []*Tensor{gp}
	}, p)
	exactOutput(out) // a loss: one element, kept float32 as every loss is
	return out
}

// RouterZLoss is the router z-loss's node: a one-element tensor holding
// value whose gradient with respect to the router logits x [N, E] is that
// of scale·Σ_t logsumexp(x_t)², i.e. scale·2·lse_t·softmax(x_t).
func RouterZLoss(x *Tensor, scale, value float64) *Tensor {
	checkFloat("RouterZLoss", x)
	out := like(x, 1)
	out.Set(0, value)
	record(out, "router_z_loss", func(_ *Backprop, g *Tensor) []*Tensor {
		E := x.Dim(-1)
		gx := like(x, x.shape...)
		gv := g.At(0)
		for t := 0; t < x.Numel()/E; t++ {
			lse := LogSumExpRow(x, t)
			for j := 0; j < E; j++ {
				gx.Set(t*E+j, gv*scale*2*lse*math.Exp(x.At(t*E+j)-lse))
			}
		}
		return []*Tensor{gx}
	}, x)
	return out
}

// LogSumExpRow is log Σ_j exp(x[t, j]) over the last dimension of x.
func LogSumExpRow(x *Tensor, t int) float64 {
	E := x.Dim(-1)
	m := math.Inf(-1)
	for j := 0; j < E; j++ {
		m = math.Max(m, x.At(t*E+j))
	}
	var s float64
	for j := 0; j < E; j++ {
		s += math.Exp(x.At(t*E+j) - m)
	}
	return m + math.Log(s)
}

// WithLoss returns x unchanged (sharing its storage) with loss, a
// one-element tensor, attached: the backward that reaches x also
// differentiates loss, with gradient scale. A layer's auxiliary loss rides
// the activations this way into the step's backward, so every schedule
// that differentiates the model's output also trains it; scale is how much
// one unit of this loss weighs in the step's loss (1/grad_accum).
func WithLoss(x, loss *Tensor, scale float64) *Tensor {
	out := x.Reshape(x.shape...)
	record(out, "with_loss", func(_ *Backprop, g *Tensor) []*Tensor {
		gl := like(loss, 1)
		gl.Set(0, scale)
		return []*Tensor{g, gl}
	}, x, loss)
	return out
}
