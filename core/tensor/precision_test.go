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
	rnd := func(n int) []float32 { return normals(rng, n) }
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
		// y = x̂ŵ + b̂, z = ŷ v̂ᵀ, dz = r, dy = r̂ v̂, dv = r̂ᵀ ŷ,
		// dx = dŷ ŵᵀ, dw = x̂ᵀ dŷ, db = Σ dy, with b̂ the bias's copy.
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
			y[i] += float64(c.round(b[i%24])) // the bias's copy, as every op reads a parameter
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

// halfGraph runs x → Linear(w1, b1) = h → Gelu = g → Linear(w2, b2) = y →
// sum(y·r) on a bf16 rank, storing h and g in 2 bytes (StoreHalf) or
// rounding them in place (RoundHalf) after the forward, and returns the
// gradients of x, w1 and w2, the activation bytes held after the forward
// and whether the backward widened h and g; deferW defers the weight
// gradients to after the backward (zero-bubble pipelines). gAtW2 says g
// was still stored, with no float32 storage, when the second Linear's
// weight gradient was first asked for (its product reads g).
func halfGraph(store, deferW bool, x, w1, w2, r []float32) (grads [][]float64, held int64, widened [2]bool, gAtW2 bool) {
	a := NewAllocator()
	a.SetCompute(BFloat16)
	param := func(data []float32, shape ...int) *Tensor {
		t := a.New(Params, Float32, shape...)
		copy(t.F32(), data)
		return t.RequiresGrad()
	}
	xt, w1t, w2t := param(x, 6, 16), param(w1, 16, 32), param(w2, 32, 8)
	b1, b2 := param(make([]float32, 32), 32), param(make([]float32, 8), 8)
	h := Linear(xt, w1t, b1)
	g := Gelu(h)
	y := Linear(g, w2t, b2)
	rt := a.New(Activations, Float32, 6, 8)
	copy(rt.F32(), r)
	loss := Sum(Mul(y, rt))
	if store {
		StoreHalf(y, h)
	} else {
		RoundHalf(h)
		RoundHalf(g)
	}
	held = a.Usage().Current[Activations]
	need := func(p *Tensor, _ PassInfo) {
		if p == w2t {
			gAtW2 = g.stored() && g.f32 == nil
		}
	}
	d, err := Backward(loss, nil, BackwardOptions{Release: true, Alloc: a, DeferWeightGrads: deferW, NeedGrad: need})
	if err != nil {
		panic(err)
	}
	d.Run()
	return [][]float64{xt.Grad.Float64s(), w1t.Grad.Float64s(), w2t.Grad.Float64s()}, held, [2]bool{h.refilled, g.refilled}, gAtW2
}

// TestStoreHalfWidensExactly: activations stored in 2 bytes after the
// forward take 2 bytes each, and the backward reads them widened exactly
// or, where their readers' backwards read them as stored (h, GELU's
// input, widened a piece at a time in its kernel; g, Linear's input, an
// operand of its weight gradient's product), as stored: its gradients are
// bitwise those of a backward reading the same activations rounded in
// place in float32, and neither h nor g is widened into float32 storage.
func TestStoreHalfWidensExactly(t *testing.T) {
	rng := rand.New(rand.NewSource(5))
	rnd := func(n int) []float32 { return normals(rng, n) }
	x, w1, w2, r := rnd(6*16), rnd(16*32), rnd(32*8), rnd(6*8)
	stored, heldStored, widened, gAtW2 := halfGraph(true, false, x, w1, w2, r)
	rounded, heldRounded, _, _ := halfGraph(false, false, x, w1, w2, r)
	require.Equal(t, rounded, stored)
	require.True(t, gAtW2, "the second Linear's input still stored, not widened, when its weight gradient's product reads it")
	deferred, _, _, _ := halfGraph(true, true, x, w1, w2, r)
	require.Equal(t, rounded, deferred, "weight gradients deferred past the backward")
	require.Equal(t, [2]bool{false, false}, widened, "h read as stored by Gelu's backward, g by Linear's")
	require.Equal(t, int64(2*(6*32+6*32)), heldRounded-heldStored, "h and g stored in 2 bytes instead of 4")
}

// TestLinearInputNarrowedOnce: on the bf16 kernel, in a forward StoreHalf
// follows, a Linear's forward reads the 2-byte copy of an input that
// StoreHalf will store: the one GELU wrote with its output, or one it
// narrows itself (a Linear's output); StoreHalf keeps the same copy
// rather than rounding the input again. The products are bitwise the
// ones that round the float32 input as they read it, the copies hold the
// inputs' bf16 bits, and an input StoreHalf does not store (a leaf) is
// read as float32 without a copy.
func TestLinearInputNarrowedOnce(t *testing.T) {
	if !cpu.HalfKernel(false) {
		t.Skip("bf16 products take the portable path here: " + cpu.HalfGemmPath())
	}
	rng := rand.New(rand.NewSource(9))
	rnd := func(n int) []float32 { return normals(rng, n) }
	a := NewAllocator()
	a.SetCompute(BFloat16)
	param := func(data []float32, shape ...int) *Tensor {
		t := a.New(Params, Float32, shape...)
		copy(t.F32(), data)
		return t.RequiresGrad()
	}
	const rows, in, mid, out = 13, 16, 34, 8
	xt, w1, w2, b2 := param(rnd(rows*in), rows, in), param(rnd(in*mid), in, mid), param(rnd(mid*out), mid, out), param(rnd(out), out)
	w3 := param(rnd(out*in), out, in)
	done := StoringHalf(xt)
	h := Linear(xt, w1, nil)
	require.Nil(t, xt.early, "a leaf is not stored: read as float32")
	g := Gelu(h)
	gf := append([]float32(nil), g.f32...)
	y := Linear(g, w2, b2)
	require.NotNil(t, g.early, "GELU's output narrowed for the product")
	copyBits := g.early
	want := make([]uint16, len(gf))
	cpu.BF16FromF32s(want, gf)
	require.Equal(t, want, copyBits.u16)
	w2h, bias := make([]uint16, mid*out), append([]float32(nil), b2.f32...)
	cpu.BF16FromF32s(w2h, w2.f32)
	cpu.RoundBF16(bias)
	ref := make([]float32, rows*out)
	cpu.GemmRoundAHalfBBias(false, false, false, rows, out, mid, 1, gf, mid, w2h, out, bias, ref, out)
	require.Equal(t, ref, y.f32, "the product from the copy is the one rounding g as it reads it")
	yf := append([]float32(nil), y.f32...)
	z := Linear(y, w3, nil)
	require.NotNil(t, y.early, "a Linear's output narrowed by the next Linear for its product")
	cpu.BF16FromF32s(want[:len(yf)], yf)
	require.Equal(t, want[:len(yf)], y.early.u16)
	w3h, refZ := make([]uint16, out*in), make([]float32, rows*in)
	cpu.BF16FromF32s(w3h, w3.f32)
	cpu.GemmRoundAHalfB(false, false, false, rows, in, out, 1, yf, out, w3h, in, 0, refZ, in)
	require.Equal(t, refZ, z.f32, "the product from y's copy is the one rounding y as it reads it")
	StoreHalf(z, h)
	done()
	require.Same(t, copyBits, g.half, "StoreHalf keeps the copy the product read")
	require.Nil(t, g.early)
	require.Nil(t, g.f32)
}

// TestGeluReadsStoredInput: GELU's backward reads an input stored in
// bf16 or fp16 as stored, leaving it stored, and its gradient is bitwise
// the float32 kernel's on the widened values.
func TestGeluReadsStoredInput(t *testing.T) {
	for _, d := range []DType{BFloat16, Float16} {
		rng := rand.New(rand.NewSource(7))
		a := NewAllocator()
		a.SetCompute(d)
		p := a.New(Params, Float32, 4, 8)
		w := a.New(Params, Float32, 8, 300)
		for _, v := range [][]float32{p.F32(), w.F32()} {
			for i := range v {
				v[i] = float32(rng.NormFloat64())
			}
		}
		p.RequiresGrad()
		x := Linear(p, w, nil) // an activation with a producer, which StoreHalf stores
		y := Gelu(x)
		StoreHalf(y, x)
		require.True(t, x.stored())
		widened := make([]float32, x.Numel())
		WidenHalf(d, widened, x.half.u16)
		g := a.New(Activations, Float32, 4, 300)
		for i := range g.F32() {
			g.F32()[i] = float32(rng.NormFloat64())
		}
		want := make([]float32, len(widened))
		cpu.GeluBackward(widened, g.F32(), want)
		require.True(t, y.node.readsHalf, "the pass leaves GELU's input stored")
		gx := y.node.backward(nil, g)[0]
		require.True(t, x.stored(), "still stored after the backward")
		require.Nil(t, x.f32, "never widened")
		require.Equal(t, want, gx.F32(), d.String())
	}
}

// TestLayerNormReadsStoredInput: LayerNorm's backward reads an input
// stored in bf16 or fp16 as stored, leaving it stored, and its gradients
// are bitwise the float32 kernel's on the widened values.
func TestLayerNormReadsStoredInput(t *testing.T) {
	for _, d := range []DType{BFloat16, Float16} {
		rng := rand.New(rand.NewSource(8))
		a := NewAllocator()
		a.SetCompute(d)
		p := a.New(Params, Float32, 40, 8)
		w := a.New(Params, Float32, 8, 48)
		lw, lb := a.New(Params, Float32, 48), a.New(Params, Float32, 48)
		for _, v := range [][]float32{p.F32(), w.F32(), lw.F32(), lb.F32()} {
			for i := range v {
				v[i] = float32(rng.NormFloat64())
			}
		}
		p.RequiresGrad()
		x := Linear(p, w, nil) // an activation with a producer, which StoreHalf stores
		y := LayerNorm(x, lw, lb, 1e-5)
		StoreHalf(y, x)
		require.True(t, x.stored())
		widened := make([]float32, x.Numel())
		WidenHalf(d, widened, x.half.u16)
		g := a.New(Activations, Float32, 40, 48)
		for i := range g.F32() {
			g.F32()[i] = float32(rng.NormFloat64())
		}
		lwv, done := ReadParam(lw)
		mean, rstd := y.node.saved[0].F32(), y.node.saved[1].F32()
		want, wdw, wdb := make([]float32, len(widened)), make([]float32, 48), make([]float32, 48)
		cpu.LayerNormBackward(g.F32(), widened, lwv.F32(), mean, rstd, want, wdw, wdb, 40, 48)
		done()
		require.True(t, y.node.readsHalf, "the pass leaves LayerNorm's input stored")
		gs := y.node.backward(nil, g)
		require.True(t, x.stored(), "still stored after the backward")
		require.Nil(t, x.f32, "never widened")
		require.Equal(t, want, gs[0].F32(), d.String())
		require.Equal(t, wdw, gs[1].F32(), d.String())
		require.Equal(t, wdb, gs[2].F32(), d.String())
	}
}

// TestCrossEntropyHalf: on a bf16 rank the cross-entropy rounds its
// logits to bf16, computes in float32 from them and keeps them in 2 bytes
// for the backward, which forms the probabilities again: loss and
// gradient are bitwise float32's cross-entropy of the rounded logits.
func TestCrossEntropyHalf(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	logits := make([]float32, 12*50)
	for i := range logits {
		logits[i] = 3 * float32(rng.NormFloat64())
	}
	targets := []int32{1, 4, 49, 0, -1, 7, 7, 30, 2, 11, 48, 5}
	run := func(d DType, data []float32) (loss float64, grad []float64, held int64) {
		a := NewAllocator()
		a.SetCompute(d)
		w := a.New(Params, Float32, 12, 50)
		copy(w.F32(), data)
		w.RequiresGrad()
		// An op's output, as the head's logits are (w·1: its gradient
		// is the logits').
		ones := a.New(Activations, Float32, 12, 50)
		for i := range ones.F32() {
			ones.F32()[i] = 1
		}
		l := Mul(w, ones)
		tg := a.New(Activations, Int32, 12)
		copy(tg.I32(), targets)
		before := a.Usage().Current[Activations]
		ce := CrossEntropy(l, tg)
		held = a.Usage().Current[Activations] - before
		if _, err := Backward(ce, nil, BackwardOptions{Alloc: a}); err != nil {
			panic(err)
		}
		return ce.Scalar(), w.Grad.Float64s(), held
	}
	rounded := append([]float32(nil), logits...)
	cpu.RoundBF16(rounded)
	lossHalf, gradHalf, heldHalf := run(BFloat16, logits)
	lossF32, gradF32, heldF32 := run(Float32, rounded)
	require.Equal(t, lossF32, lossHalf)
	require.Equal(t, gradF32, gradHalf)
	require.Equal(t, heldF32-heldHalf, int64(2*12*50+4*12*50), "the probabilities (4 bytes) not kept, the logits stored in 2")
}

// TestOpsReadParamCopies: under mixed precision every op reads a parameter
// as its 2-byte copy (precision.go): a small model of every op that reads
// parameters (the lookups, LayerNorm, RMSNorm, Linear with its bias, the
// tied head) gives bitwise the same output and gradients on float32
// parameters as on the same parameters rounded to the compute dtype
// beforehand, which a ZeRO rank's widened copies are.
func TestOpsReadParamCopies(t *testing.T) {
	rng := rand.New(rand.NewSource(5))
	const V, T, C, B = 11, 4, 8, 2
	shapes := map[string][]int{"wte": {V, C}, "wpe": {T + 2, C}, "ln.w": {C}, "ln.b": {C}, "rms.w": {C}, "fc.w": {C, C}, "fc.b": {C}}
	values := map[string][]float32{}
	for name, sh := range shapes {
		n := 1
		for _, d := range sh {
			n *= d
		}
		values[name] = make([]float32, n)
		for i := range values[name] {
			values[name][i] = float32(rng.NormFloat64())
		}
	}
	r := make([]float32, B*T*V)
	for i := range r {
		r[i] = float32(rng.NormFloat64())
	}
	run := func(d DType, round func([]float32)) []float64 {
		a := NewAllocator()
		a.SetCompute(d)
		ps := map[string]*Tensor{}
		for name, sh := range shapes {
			p := a.New(Params, Float32, sh...)
			copy(p.F32(), values[name])
			round(p.F32())
			p.Name = name
			ps[name] = p.RequiresGrad()
		}
		idx := a.New(Activations, Int32, B, T)
		for i := range idx.I32() {
			idx.I32()[i] = int32((7 * i) % V)
		}
		x := AddPositions(Embedding(ps["wte"], idx), ps["wpe"], []int{2, 0, 5, 3})
		x = LayerNorm(x, ps["ln.w"], ps["ln.b"], 1e-5)
		x = Linear(RMSNorm(x, ps["rms.w"], 1e-6), ps["fc.w"], ps["fc.b"])
		z := MatMulT(x, ps["wte"])
		rt := a.New(Activations, Float32, B, T, V)
		copy(rt.F32(), r)
		if _, err := Backward(Sum(Mul(z, rt)), nil, BackwardOptions{}); err != nil {
			t.Fatal(err)
		}
		out := z.Float64s()
		for _, name := range []string{"wte", "wpe", "ln.w", "ln.b", "rms.w", "fc.w", "fc.b"} {
			out = append(out, ps[name].Grad.Float64s()...)
		}
		return out
	}
	for _, c := range []struct {
		d     DType
		round func([]float32)
	}{{BFloat16, cpu.RoundBF16}, {Float16, cpu.RoundF16}} {
		got := run(c.d, func([]float32) {})
		want := run(c.d, c.round)
		require.Equal(t, want, got, "%s: the ops read the parameters' copies", c.d)
		require.NotEqual(t, run(Float32, func([]float32) {}), got, "%s: the half path changed nothing", c.d)
	}
}

// TestStoreHalfKeepsRouterRowsExact: on a bf16 rank a router's logits are
// stored in 2 bytes with the rest of a block, but its probabilities
// (SoftmaxRows) and renormalised weights (RoutedWeights) stay float32:
// their backwards read them beside the identity that each row sums to
// one. So the gradient keeps softmax's invariance to a shift of a row's
// logits: each row of the router weight's gradient (its C inputs, summed
// over the experts) is zero to float32 rounding, where probabilities
// rounded to bf16 leave 2^-8 of the gradient there.
func TestStoreHalfKeepsRouterRowsExact(t *testing.T) {
	const N, C, E, k = 16, 8, 4, 2
	rng := rand.New(rand.NewSource(7))
	a := NewAllocator()
	a.SetCompute(BFloat16)
	param := func(shape ...int) *Tensor {
		p := a.New(Params, Float32, shape...)
		for i := range p.F32() {
			p.F32()[i] = float32(rng.NormFloat64())
		}
		return p.RequiresGrad()
	}
	x, w := param(N, C), param(C, E)
	logits := Linear(x, w, nil)
	p := SoftmaxRows(logits)
	choice := make([]int, 0, N*k)
	for range N {
		choice = append(choice, rng.Perm(E)[:k]...)
	}
	rw := RoutedWeights(p, choice, k)
	r := a.New(Activations, Float32, N, k)
	for i := range r.F32() {
		r.F32()[i] = float32(rng.NormFloat64())
	}
	loss := Sum(Mul(rw, r))
	before := a.Usage().Current[Activations]
	StoreHalf(loss, x)
	require.Equal(t, int64(2*(N*E+N*k)), before-a.Usage().Current[Activations], "the logits and the product stored in 2 bytes, the probabilities and weights not")
	_, err := Backward(loss, nil, BackwardOptions{Release: true, Alloc: a})
	require.NoError(t, err)
	g := w.Grad.Float64s()
	var scale float64
	for _, v := range g {
		scale = math.Max(scale, math.Abs(v))
	}
	for c := 0; c < C; c++ {
		var s float64
		for e := 0; e < E; e++ {
			s += g[c*E+e]
		}
		require.LessOrEqual(t, math.Abs(s), 1e-6*scale, "row %d of the router's gradient sums to %v", c, s)
	}
}

// normals is n draws of rng's standard normal as float32.
func normals(rng *rand.Rand, n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(rng.NormFloat64())
	}
	return out
}
