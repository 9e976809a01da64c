package tensor

import (
	"errors"
	"math/rand"
	"testing"

	"github.com/stretchr/testify/require"
)

// doubleFn is a custom function: y = 2x, with a backward that also counts
// its calls.
type doubleFn struct{ backwardCalls *int }

func (f doubleFn) Forward(ctx *FuncCtx, in ...*Tensor) (*Tensor, error) {
	out := Default.New(Activations, in[0].DType(), in[0].Shape()...)
	for i := 0; i < out.Numel(); i++ {
		out.Set(i, 2*in[0].At(i))
	}
	ctx.Save(in[0])
	return out, nil
}

func (f doubleFn) Backward(ctx *FuncCtx, g *Tensor) ([]*Tensor, error) {
	*f.backwardCalls++
	gx := Default.New(Activations, g.DType(), ctx.Saved()[0].Shape()...)
	for i := 0; i < gx.Numel(); i++ {
		gx.Set(i, 2*g.At(i))
	}
	return []*Tensor{gx}, nil
}

func TestCustomFunction(t *testing.T) {
	calls := 0
	x := FromF64([]float64{1, -2, 3}, 3).RequiresGrad()
	y, err := Apply("double", doubleFn{&calls}, x)
	require.NoError(t, err)
	require.Equal(t, []float64{2, -4, 6}, y.Float64s())
	loss := Sum(Mul(y, FromF64([]float64{1, 10, 100}, 3)))
	_, err = Backward(loss, nil, BackwardOptions{})
	require.NoError(t, err)
	require.Equal(t, 1, calls)
	require.Equal(t, []float64{2, 20, 200}, x.Grad.Float64s())
}

// scratchFn is y = x with a buffer of n elements handed to the graph.
type scratchFn struct {
	a *Allocator
	n int
}

func (f scratchFn) Forward(ctx *FuncCtx, in ...*Tensor) (*Tensor, error) {
	ctx.Own(f.a.New(Activations, Float64, f.n))
	out := f.a.New(Activations, Float64, in[0].Shape()...)
	out.CopyFrom(in[0])
	return out, nil
}

func (f scratchFn) Backward(ctx *FuncCtx, g *Tensor) ([]*Tensor, error) { return []*Tensor{g}, nil }

// Buffers a Function owns go back to the allocator with the graph: after a
// backward that releases it, after FreeGraph, and at once when nothing
// needs a gradient.
func TestCustomFunctionOwnedBuffersAreReleased(t *testing.T) {
	a := NewAllocator()
	const scratch = 1000 * 8
	x := FromF64([]float64{1, 2}, 2).RequiresGrad()
	y, err := Apply("scratch", scratchFn{a, 1000}, x)
	require.NoError(t, err)
	require.Equal(t, int64(scratch+16), a.Usage().Current[Activations])
	_, err = Backward(Sum(y), nil, BackwardOptions{Release: true, Alloc: a})
	require.NoError(t, err)
	require.Less(t, a.Usage().Current[Activations], int64(scratch), "released with the graph after backward")

	b := NewAllocator()
	y, err = Apply("scratch", scratchFn{b, 1000}, x)
	require.NoError(t, err)
	FreeGraph(y)
	require.Equal(t, int64(16), b.Usage().Current[Activations], "FreeGraph releases it")

	c := NewAllocator()
	_, err = Apply("scratch", scratchFn{c, 1000}, FromF64([]float64{1, 2}, 2))
	require.NoError(t, err)
	require.Equal(t, int64(16), c.Usage().Current[Activations], "no graph: released at once")
}

type failingFn struct{}

func (failingFn) Forward(ctx *FuncCtx, in ...*Tensor) (*Tensor, error) {
	return in[0].Clone(Activations), nil
}
func (failingFn) Backward(ctx *FuncCtx, g *Tensor) ([]*Tensor, error) {
	return nil, errors.New("peer rank 3 went away")
}

func TestCustomFunctionErrorBecomesBackwardError(t *testing.T) {
	x := FromF64([]float64{1}, 1).RequiresGrad()
	y, err := Apply("allreduce", failingFn{}, x)
	require.NoError(t, err)
	_, err = Backward(Sum(y), nil, BackwardOptions{})
	require.EqualError(t, err, "tensor: backward of allreduce: peer rank 3 went away")
}

// TestTiedGradReadyFiresOnceAfterBothUses uses one table as an embedding
// and as an output head, like GPT-2's wte.
func TestTiedGradReadyFiresOnceAfterBothUses(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	wte := randT(r, 1, 5, 3)
	wte.Name = "wte"
	other := randT(r, 1, 3)
	other.Name = "ln"
	idx := FromI32([]int32{0, 2, 4}, 1, 3)
	targets := FromI32([]int32{1, 2, 3}, 1, 3)
	h := Embedding(wte, idx)
	h = Add(h, View(Linear(h, randT(r, 1, 3, 3), other), 1, 3, 3))
	loss := CrossEntropy(MatMulT(h, wte), targets)

	var fired []string
	var gradAtFire []float64
	_, err := Backward(loss, nil, BackwardOptions{GradReady: func(p *Tensor, _ PassInfo) {
		fired = append(fired, p.Name)
		if p == wte {
			gradAtFire = p.Grad.Float64s()
		}
	}})
	require.NoError(t, err)
	count := 0
	for _, n := range fired {
		if n == "wte" {
			count++
		}
	}
	require.Equal(t, 1, count, "wte must fire exactly once: %v", fired)
	require.Equal(t, "wte", fired[len(fired)-1], "wte's last contribution (the embedding) comes last in backward")
	// Its gradient when it fired is the final one: both contributions.
	require.Equal(t, wte.Grad.Float64s(), gradAtFire)

	// Compare with the two contributions computed separately.
	wte2 := wte.Clone(Params).RequiresGrad()
	headOnly := CrossEntropy(MatMulT(h.Detach(), wte2), targets)
	_, err = Backward(headOnly, nil, BackwardOptions{})
	require.NoError(t, err)
	var differs bool
	for i := range gradAtFire {
		if gradAtFire[i] != wte2.Grad.f64[i] {
			differs = true
		}
	}
	require.True(t, differs, "the embedding contribution must be included")
}

func TestDeferredWeightGradsMatchFused(t *testing.T) {
	build := func(r *rand.Rand) (loss *Tensor, params []*Tensor) {
		x := randT(r, 1, 4, 6)
		w1, b1 := randT(r, 0.5, 6, 8), randT(r, 0.5, 8)
		w2 := randT(r, 0.5, 5, 8)
		h := Gelu(Linear(x, w1, b1))
		return CrossEntropy(MatMulT(h, w2), FromI32([]int32{0, 1, 2, 3}, 4)), []*Tensor{x, w1, b1, w2}
	}
	lossA, pa := build(rand.New(rand.NewSource(3)))
	_, err := Backward(lossA, nil, BackwardOptions{})
	require.NoError(t, err)

	lossB, pb := build(rand.New(rand.NewSource(3)))
	var ready []*Tensor
	d, err := Backward(lossB, nil, BackwardOptions{DeferWeightGrads: true,
		GradReady: func(p *Tensor, _ PassInfo) { ready = append(ready, p) }})
	require.NoError(t, err)
	require.Equal(t, 3, d.Len(), "w1, b1 and w2 are queued")
	require.NotNil(t, pb[0].Grad, "the input gradient is computed at once")
	require.Nil(t, pb[1].Grad)
	require.Equal(t, []*Tensor{pb[0]}, ready)
	d.Run()
	require.Len(t, ready, 4)
	for i := range pa {
		require.Equal(t, pa[i].Grad.Float64s(), pb[i].Grad.Float64s(), "param %d", i)
	}
}

func TestSeveralGraphsAndGivenOutputGradient(t *testing.T) {
	r := rand.New(rand.NewSource(4))
	w := randT(r, 1, 3, 2)
	x1, x2 := randT(r, 1, 2, 3), randT(r, 1, 2, 3)
	y1, y2 := Linear(x1, w, nil), Linear(x2, w, nil) // two micro-batches alive at once
	g := FromF64([]float64{1, 2, 3, 4}, 2, 2)
	_, err := Backward(y2, g, BackwardOptions{Info: PassInfo{Micro: 1}})
	require.NoError(t, err)
	_, err = Backward(y1, g, BackwardOptions{Info: PassInfo{Micro: 0, Last: true}})
	require.NoError(t, err)
	require.Equal(t, []float64{1, 2, 3, 4}, g.Float64s(), "the caller's gradient is not modified")
	// dW = x1ᵀg + x2ᵀg
	for i := 0; i < 3; i++ {
		for j := 0; j < 2; j++ {
			var want float64
			for rr := 0; rr < 2; rr++ {
				want += (x1.f64[rr*3+i] + x2.f64[rr*3+i]) * g.f64[rr*2+j]
			}
			require.InDelta(t, want, w.Grad.f64[i*2+j], 1e-12)
		}
	}
}

func TestBackwardOrderIsDeterministic(t *testing.T) {
	order := func() []string {
		r := rand.New(rand.NewSource(5))
		var names []string
		x := randT(r, 1, 2, 4)
		var ps []*Tensor
		h := x
		for i := 0; i < 4; i++ {
			w := randT(r, 0.5, 4, 4)
			w.Name = string(rune('a' + i))
			ps = append(ps, w)
			h = Add(h, Gelu(Linear(h, w, nil)))
		}
		_, err := Backward(Sum(h), nil, BackwardOptions{GradReady: func(p *Tensor, _ PassInfo) {
			if p.Name != "" {
				names = append(names, p.Name)
			}
		}})
		require.NoError(t, err)
		return names
	}
	first := order()
	require.Equal(t, []string{"d", "c", "b", "a"}, first, "reverse order of use")
	for i := 0; i < 5; i++ {
		require.Equal(t, first, order())
	}
}

func TestHookAndPassInfo(t *testing.T) {
	x := FromF64([]float64{1, 2}, 2).RequiresGrad()
	var got []PassInfo
	y := Hook(Scale(x, 3), "h", func(b *Backprop) { got = append(got, b.Info) })
	_, err := Backward(Sum(y), nil, BackwardOptions{Info: PassInfo{Micro: 2, Last: true}})
	require.NoError(t, err)
	require.Equal(t, []PassInfo{{Micro: 2, Last: true}}, got)
	require.Equal(t, []float64{3, 3}, x.Grad.Float64s())
}

func TestReleaseReturnsActivations(t *testing.T) {
	a := NewAllocator()
	r := rand.New(rand.NewSource(6))
	w := a.New(Params, Float32, 8, 8).RequiresGrad()
	for i := range w.f32 {
		w.f32[i] = float32(r.NormFloat64())
	}
	x := a.New(Activations, Float32, 4, 8)
	before := a.Usage().Current[Activations]
	y := Gelu(Linear(x, w, nil))
	loss := CrossEntropy(y, FromI32([]int32{1, 2, 3, 4}, 4))
	require.Greater(t, a.Usage().Current[Activations], before)
	_, err := Backward(loss, nil, BackwardOptions{Release: true, Alloc: a})
	require.NoError(t, err)
	loss.Release()
	require.Equal(t, before, a.Usage().Current[Activations], "every intermediate buffer is released")
	require.Equal(t, int64(8*8*4), a.Usage().Current[Grads])
}

// addWeightFn is y = x + w whose backward returns a fresh buffer for w's
// gradient, as a plugin's custom op does.
type addWeightFn struct{ a *Allocator }

func (f addWeightFn) Forward(ctx *FuncCtx, in ...*Tensor) (*Tensor, error) {
	out := f.a.New(Activations, in[0].DType(), in[0].Shape()...)
	for i := 0; i < out.Numel(); i++ {
		out.Set(i, in[0].At(i)+in[1].At(i))
	}
	return out, nil
}

func (f addWeightFn) Backward(ctx *FuncCtx, g *Tensor) ([]*Tensor, error) {
	gw := f.a.New(Activations, g.DType(), g.Shape()...)
	gw.CopyFrom(g)
	return []*Tensor{g, gw}, nil
}

// TestLeafContributionsReleasedPerOp: a gradient an op returns for a
// leaf is added into the leaf's Grad and released when that op is done,
// so a backward through layers whose ops return weight gradients holds one
// layer's temporary at a time, not one per layer until the pass ends.
// Built-in ops add into Grad in place and return none (checked with the
// Linear chain: no activation is allocated for a weight gradient).
func TestLeafContributionsReleasedPerOp(t *testing.T) {
	const n, layers = 1000, 6
	a := NewAllocator()
	x := a.New(Activations, Float64, n)
	h := x
	var ws []*Tensor
	for i := 0; i < layers; i++ {
		w := a.New(Params, Float64, n).RequiresGrad()
		ws = append(ws, w)
		var err error
		h, err = Apply("add_weight", addWeightFn{a}, h, w)
		require.NoError(t, err)
	}
	loss := Sum(h)
	before := a.Usage().Current[Activations]
	_, err := Backward(loss, nil, BackwardOptions{Release: true, Alloc: a})
	require.NoError(t, err)
	for _, w := range ws {
		require.Equal(t, float64(1), w.Grad.At(n-1))
	}
	// Sum's gradient (n) and one op's temporary (n) beside what forward
	// left, plus the root's one-element gradient.
	added := a.Usage().Peak[Activations] - before
	require.LessOrEqual(t, added, int64(8*(2*n+1)), "bytes backward added to the activations")

	// Linear: x·w with w a leaf; its weight gradient goes into w.Grad.
	b := NewAllocator()
	xin := b.New(Activations, Float64, 4, 8)
	wl := b.New(Params, Float64, 8, 64).RequiresGrad()
	y := Linear(xin, wl, nil)
	loss = Sum(y)
	before = b.Usage().Current[Activations]
	_, err = Backward(loss, nil, BackwardOptions{Release: true, Alloc: b})
	require.NoError(t, err)
	require.LessOrEqual(t, b.Usage().Peak[Activations]-before, int64(8*(4*64+1)), "Linear formed its weight gradient outside w.Grad")
}

// TestMatMulTLogitsGoBeforeItsBackward: the output head's logits are read
// by the cross-entropy's backward, not by MatMulT's, so they are given
// back before MatMulT's backward asks for the weight's gradient buffer:
// the head's gradient does not sit beside a logits-sized buffer no one
// reads any more, in float32 as under mixed precision, where the logits
// were widened from their 2-byte copy for the cross-entropy.
func TestMatMulTLogitsGoBeforeItsBackward(t *testing.T) {
	for _, compute := range []DType{Float32, BFloat16} {
		a := NewAllocator()
		a.SetCompute(compute)
		r := rand.New(rand.NewSource(7))
		w := a.New(Params, Float32, 64, 8).RequiresGrad()
		w.Name = "wte"
		x := a.New(Params, Float32, 4, 8).RequiresGrad()
		for _, p := range []*Tensor{w, x} {
			for i := range p.f32 {
				p.f32[i] = float32(r.NormFloat64())
			}
		}
		h := Gelu(x)
		logits := MatMulT(h, w)
		loss := CrossEntropy(logits, FromI32([]int32{1, 2, 3, 4}, 4))
		held := true
		_, err := Backward(loss, nil, BackwardOptions{Release: true, Alloc: a, NeedGrad: func(p *Tensor, _ PassInfo) {
			if p == w {
				held = logits.HasStorage()
			}
		}})
		require.NoError(t, err)
		require.False(t, held, "%s: the logits still had storage when the head's weight gradient was made", compute)
		require.NotNil(t, w.Grad)
	}
}

// TestCrossEntropyReadsStoredLogits: under mixed precision the
// cross-entropy's backward forms the logits' gradient from their 2-byte
// copy in the gradient's own buffer, so the backward adds one float32
// logits-sized buffer to what the forward kept, not two (the logits
// widened beside their gradient); the gradient is bitwise the one formed
// from the widened logits.
func TestCrossEntropyReadsStoredLogits(t *testing.T) {
	const rows, V = 4, 1000
	grad := func(readsHalf bool) ([]float32, int64) {
		a := NewAllocator()
		a.SetCompute(BFloat16)
		r := rand.New(rand.NewSource(8))
		x := a.New(Params, Float32, rows, 8).RequiresGrad()
		w := a.New(Params, Float32, V, 8).RequiresGrad()
		for _, p := range []*Tensor{x, w} {
			for i := range p.f32 {
				p.f32[i] = float32(r.NormFloat64())
			}
		}
		logits := MatMulT(x, w)
		loss := CrossEntropy(logits, FromI32([]int32{1, 2, -1, 999}, rows))
		require.True(t, logits.stored())
		loss.node.readsHalf = readsHalf
		before := a.Usage().Current[Activations]
		a.ResetPeak()
		_, err := Backward(loss, nil, BackwardOptions{Release: true, Alloc: a})
		require.NoError(t, err)
		return append(append([]float32(nil), x.Grad.f32...), w.Grad.f32...), a.Usage().Peak[Activations] - before
	}
	g, added := grad(true)
	gw, addedWidened := grad(false)
	require.Equal(t, gw, g)
	require.LessOrEqual(t, added, int64(4*rows*V+64), "the backward widened the logits beside their gradient")
	require.GreaterOrEqual(t, addedWidened, int64(6*rows*V), "widened, the logits sit beside their gradient")
}
