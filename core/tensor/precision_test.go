package tensor

import (
	"math"
	"math/rand"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/tensor/cpu"
)

// relNorm is ||got - want|| / ||want||.
func relNorm(got, want []float64) float64 {
	var num, den float64
	for i := range want {
		num += (got[i] - want[i]) * (got[i] - want[i])
		den += want[i] * want[i]
	}
	return math.Sqrt(num / den)
}

// linearRun builds y = Linear(x, w, b) and z = MatMulT(y, v) on an allocator
// with compute dtype d, backpropagates sum(z * r) and returns z and the
// gradients of x, w, b and v.
func linearRun(d DType, x, w, b, v, r []float32) (z, gx, gw, gb, gv []float64) {
	a := NewAllocator()
	a.SetCompute(d)
	param := func(data []float32, shape ...int) *Tensor {
		t := a.New(Params, Float32, shape...)
		copy(t.F32(), data)
		return t.RequiresGrad()
	}
	xt, wt, bt, vt := param(x, 6, 40), param(w, 40, 24), param(b, 24), param(v, 10, 24)
	y := Linear(xt, wt, bt)
	zt := MatMulT(y, vt)
	rt := a.New(Activations, Float32, 6, 10)
	copy(rt.F32(), r)
	if _, err := Backward(Sum(Mul(zt, rt)), nil, BackwardOptions{}); err != nil {
		panic(err)
	}
	return zt.Float64s(), xt.Grad.Float64s(), wt.Grad.Float64s(), bt.Grad.Float64s(), vt.Grad.Float64s()
}

// TestMixedPrecisionLinear: Linear and MatMulT on a bf16 or fp16 rank hold
// their float32 results (and gradients) to the norm-wise bounds,
// 1e-2 for bf16 and 2e-3 for fp16, and each product is the float32 product
// of its operands rounded to the half format: forward from x and w, and
// backward from the output gradient and the weights (input gradients) or
// the inputs (weight gradients).
func TestMixedPrecisionLinear(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	rnd := func(n int) []float32 {
		out := make([]float32, n)
		for i := range out {
			out[i] = float32(rng.NormFloat64())
		}
		return out
	}
	x, w, b, v, r := rnd(6*40), rnd(40*24), rnd(24), rnd(10*24), rnd(6*10)
	z, gx, gw, gb, gv := linearRun(Float32, x, w, b, v, r)
	for _, c := range []struct {
		d     DType
		tol   float64
		round func(float32) float32
	}{
		{BFloat16, 1e-2, func(f float32) float32 { return cpu.BF16ToF32(cpu.BF16FromF32(f)) }},
		{Float16, 2e-3, func(f float32) float32 { return cpu.F16ToF32(cpu.F16FromF32(f)) }},
	} {
		hz, hgx, hgw, hgb, hgv := linearRun(c.d, x, w, b, v, r)
		for name, p := range map[string][2][]float64{"z": {hz, z}, "dx": {hgx, gx}, "dw": {hgw, gw}, "db": {hgb, gb}, "dv": {hgv, gv}} {
			e := relNorm(p[0], p[1])
			require.LessOrEqual(t, e, c.tol, "%s %s", c.d, name)
			require.Greater(t, e, 0.0, "%s %s: the half path changed nothing", c.d, name)
		}
		// The same computation by hand in float64 on rounded operands:
		// y = x̂ŵ + b, z = ŷ v̂ᵀ, dz = r, dy = r̂ v̂, dv = r̂ᵀ ŷ,
		// dx = dŷ ŵᵀ, dw = x̂ᵀ dŷ, db = Σ dy.
		rd := func(a []float32) []float64 {
			out := make([]float64, len(a))
			for i, f := range a {
				out[i] = float64(c.round(f))
			}
			return out
		}
		mm := func(a []float64, ar, ac int, ta bool, bm []float64, br, bc int, tb bool) []float64 {
			m, k, n := ar, ac, bc
			if ta {
				m, k = ac, ar
			}
			if tb {
				n = br
			}
			out := make([]float64, m*n)
			for i := 0; i < m; i++ {
				for j := 0; j < n; j++ {
					var s float64
					for p := 0; p < k; p++ {
						var av, bv float64
						if ta {
							av = a[p*ac+i]
						} else {
							av = a[i*ac+p]
						}
						if tb {
							bv = bm[j*bc+p]
						} else {
							bv = bm[p*bc+j]
						}
						s += av * bv
					}
					out[i*n+j] = s
				}
			}
			return out
		}
		f32 := func(a []float64) []float32 {
			out := make([]float32, len(a))
			for i, f := range a {
				out[i] = float32(f)
			}
			return out
		}
		y := mm(rd(x), 6, 40, false, rd(w), 40, 24, false)
		for i := range y {
			y[i] += float64(b[i%24])
		}
		yr := rd(f32(y))
		wantZ := mm(yr, 6, 24, false, rd(v), 10, 24, true)
		dy := mm(rd(r), 6, 10, false, rd(v), 10, 24, false)
		wantDV := mm(rd(r), 6, 10, true, yr, 6, 24, false)
		wantDX := mm(rd(f32(dy)), 6, 24, false, rd(w), 40, 24, true)
		wantDW := mm(rd(x), 6, 40, true, rd(f32(dy)), 6, 24, false)
		for name, p := range map[string][2][]float64{"z": {hz, wantZ}, "dx": {hgx, wantDX}, "dw": {hgw, wantDW}, "dv": {hgv, wantDV}} {
			require.LessOrEqual(t, relNorm(p[0], p[1]), 1e-5, "%s %s against the product of rounded operands", c.d, name)
		}
	}
}

// TestComputeDTypeLeavesFloat64: float64 tensors (finite differences,
// exact equivalence) ignore the compute dtype, bitwise.
func TestComputeDTypeLeavesFloat64(t *testing.T) {
	run := func(d DType) []float64 {
		a := NewAllocator()
		a.SetCompute(d)
		x := a.New(Activations, Float64, 3, 5)
		w := a.New(Params, Float64, 5, 4)
		for i := range x.F64() {
			x.F64()[i] = math.Sin(float64(i))
		}
		for i := range w.F64() {
			w.F64()[i] = math.Cos(float64(i)) / 3
		}
		return Linear(x, w, nil).Float64s()
	}
	require.Equal(t, run(Float32), run(BFloat16))
	require.Equal(t, run(Float32), run(Float16))
}

func TestSetComputeRejects(t *testing.T) {
	require.PanicsWithValue(t, "tensor: compute dtype float64: use float32, bfloat16 or float16", func() {
		NewAllocator().SetCompute(Float64)
	})
}

// TestHalfCopies: under mixed precision a parameter's products read a
// 2-byte copy of its float32 master. The accounting counts the copy as
// parameters and the master with the optimizer state; the products are
// bitwise those that round the master as they read it (an unnamed tensor
// gets no copy); after the master changes and DropHalf, the next product
// reads the new values, and releasing the master releases its copy.
func TestHalfCopies(t *testing.T) {
	for _, d := range []DType{BFloat16, Float16} {
		t.Run(d.String(), func(t *testing.T) {
			rng := rand.New(rand.NewSource(5))
			a := NewAllocator()
			a.SetCompute(d)
			w := a.New(Params, Float32, 40, 24)
			for i := range w.F32() {
				w.F32()[i] = float32(rng.NormFloat64())
			}
			w.Name = "h.0.mlp.c_fc.weight"
			w.RequiresGrad()
			x := a.New(Activations, Float32, 6, 40)
			for i := range x.F32() {
				x.F32()[i] = float32(rng.NormFloat64())
			}
			n := int64(w.Numel())
			u := a.Usage()
			require.Equal(t, int64(0), u.Current[Params], "no copy before a product reads the parameter")
			require.Equal(t, 4*n, u.Current[OptimState], "the master counts with the optimizer state")

			// reference: the same numbers on a tensor that is not a
			// parameter, rounded as the product reads it
			ref := func() []float64 {
				c := FromF32(append([]float32(nil), w.F32()...), 40, 24)
				return Linear(x, c, nil).Float64s()
			}
			y := Linear(x, w, nil)
			require.Equal(t, ref(), y.Float64s())
			require.Equal(t, 2*n, a.Usage().Current[Params], "the copy takes 2 bytes per element")

			for i := range w.F32() {
				w.F32()[i] *= -3
			}
			DropHalf([]*Tensor{w})
			require.Equal(t, int64(0), a.Usage().Current[Params])
			require.Equal(t, ref(), Linear(x, w, nil).Float64s(), "the product reads the updated master")
			require.Equal(t, 2*n, HalfBytes([]*Tensor{w}))

			w.Release()
			u = a.Usage()
			require.Equal(t, int64(0), u.Current[Params], "releasing the master releases its copy")
			require.Equal(t, int64(0), u.Current[OptimState])
		})
	}
}
