package optim

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/tensor"
)

func TestScheduleCosine(t *testing.T) {
	sc := Schedule{Kind: "cosine", LR: 1e-3, MinLR: 1e-4, Warmup: 10, Steps: 110}
	require.InDelta(t, 1e-4, sc.At(0), 1e-15, "warm-up starts at LR/warmup")
	require.InDelta(t, 5e-4, sc.At(4), 1e-15)
	require.InDelta(t, 1e-3, sc.At(9), 1e-15, "warm-up ends at LR")
	require.InDelta(t, 1e-3, sc.At(10), 1e-15, "decay starts at LR")
	// halfway through the decay (step 10 + 99/2) the rate is the midpoint
	require.InDelta(t, 1e-4+0.5*(1e-3-1e-4), (sc.At(59)+sc.At(60))/2, 2e-7)
	require.InDelta(t, 1e-4, sc.At(109), 1e-15, "the last step reaches MinLR")
	for s := 10; s < 109; s++ {
		require.Greater(t, sc.At(s), sc.At(s+1), "monotone decay at %d", s)
	}
	require.Equal(t, 3e-4, Schedule{Kind: "constant", LR: 3e-4}.At(57))
}

func TestClipCoefMatchesTorchRule(t *testing.T) {
	require.Equal(t, 1.0, ClipCoef(0.5, 1))
	require.InDelta(t, 1/(4+1e-6), ClipCoef(4, 1), 1e-15)
	require.Equal(t, 1.0, ClipCoef(100, 0), "0 turns clipping off")
}

func TestClipGradNorm(t *testing.T) {
	a := tensor.FromF64([]float64{3, 0}, 2)
	b := tensor.FromF64([]float64{4}, 1)
	a.Grad, b.Grad = tensor.FromF64([]float64{3, 0}, 2), tensor.FromF64([]float64{4}, 1)
	norm := ClipGradNorm([]*tensor.Tensor{a, b}, 1)
	require.InDelta(t, 5, norm, 1e-12)
	require.InDelta(t, 0.6, a.Grad.At(0), 1e-6)
	require.InDelta(t, 0.8, b.Grad.At(0), 1e-6)
}

func TestDecayGroups(t *testing.T) {
	w := tensor.FromF32(make([]float32, 4), 2, 2)
	bias := tensor.FromF32(make([]float32, 2), 2)
	g := DecayGroups([]*tensor.Tensor{w, bias}, 0.1)
	require.Equal(t, []*tensor.Tensor{w}, g[0].Params)
	require.Equal(t, 0.1, g[0].WeightDecay)
	require.Equal(t, []*tensor.Tensor{bias}, g[1].Params)
	require.Equal(t, 0.0, g[1].WeightDecay)
}

// TestAdamWTwoSteps follows torch.optim.AdamW's update written out by hand.
func TestAdamWTwoSteps(t *testing.T) {
	p := tensor.FromF64([]float64{1, -2}, 2)
	o := NewAdamW(AdamWConfig{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}, []Group{{Params: []*tensor.Tensor{p}, WeightDecay: 0.1}}, nil)
	grads := [][]float64{{0.5, -1}, {0.25, 2}}
	want := []float64{1, -2}
	m, v := []float64{0, 0}, []float64{0, 0}
	lr := 1e-2
	for step, g := range grads {
		p.Grad = tensor.FromF64(append([]float64(nil), g...), 2)
		require.NoError(t, o.Step(lr))
		k := float64(step + 1)
		for i := range want {
			want[i] *= 1 - lr*0.1
			m[i] = 0.9*m[i] + 0.1*g[i]
			v[i] = 0.95*v[i] + 0.05*g[i]*g[i]
			mh := m[i] / (1 - math.Pow(0.9, k))
			vh := v[i] / (1 - math.Pow(0.95, k))
			want[i] -= lr * mh / (math.Sqrt(vh) + 1e-8)
		}
		require.InDeltaSlice(t, want, p.F64(), 1e-12, "step %d", step+1)
	}
	require.Len(t, o.State(), 2)
}

func TestSGDMomentum(t *testing.T) {
	p := tensor.FromF64([]float64{1}, 1)
	o := NewSGD(0.9, []Group{{Params: []*tensor.Tensor{p}, WeightDecay: 0.5}}, nil)
	// step 1: d = g + wd·p = 1 + 0.5 = 1.5; buf = 1.5; p = 1 - 0.1·1.5 = 0.85
	p.Grad = tensor.FromF64([]float64{1}, 1)
	require.NoError(t, o.Step(0.1))
	require.InDelta(t, 0.85, p.At(0), 1e-12)
	// step 2: d = 1 + 0.425 = 1.425; buf = 0.9·1.5 + 1.425 = 2.775; p = 0.85 - 0.2775
	require.NoError(t, o.Step(0.1))
	require.InDelta(t, 0.85-0.2775, p.At(0), 1e-12)
}

// TestAdamWResumeRestoresStepCounts resumes AdamW from its buffers and step
// counts and checks it continues exactly as the uninterrupted optimizer;
// resuming the buffers alone restarts bias correction and diverges.
func TestAdamWResumeRestoresStepCounts(t *testing.T) {
	cfg := AdamWConfig{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}
	grad := func(step int) []float64 { return []float64{0.5 - 0.1*float64(step), float64(step%3) - 1} }
	newParam := func(v []float64) *tensor.Tensor {
		p := tensor.FromF64(append([]float64(nil), v...), 2)
		p.Name = "w"
		return p
	}
	run := func(o *AdamW, p *tensor.Tensor, from, to int) {
		for s := from; s < to; s++ {
			p.Grad = tensor.FromF64(grad(s), 2)
			require.NoError(t, o.Step(1e-2))
		}
	}
	ref := newParam([]float64{1, -2})
	refOpt := NewAdamW(cfg, []Group{{Params: []*tensor.Tensor{ref}, WeightDecay: 0.1}}, nil)
	run(refOpt, ref, 0, 4)
	require.Equal(t, map[string]int{"w": 4}, refOpt.Steps())

	resume := func(withSteps bool) []float64 {
		p := newParam(ref.F64())
		o := NewAdamW(cfg, []Group{{Params: []*tensor.Tensor{p}, WeightDecay: 0.1}}, nil)
		for name, buf := range refOpt.State() {
			o.State()[name].CopyFrom(buf)
		}
		if withSteps {
			require.NoError(t, o.SetSteps(refOpt.Steps()))
		}
		run(o, p, 4, 8)
		return p.F64()
	}
	withSteps, withoutSteps := resume(true), resume(false)
	run(refOpt, ref, 4, 8)
	require.Equal(t, ref.F64(), withSteps, "buffers plus step counts continue bit for bit")
	require.NotEqual(t, ref.F64(), withoutSteps, "buffers alone restart bias correction")
	require.Equal(t, map[string]int{"w": 8}, refOpt.Steps())

	err := refOpt.SetSteps(map[string]int{"h.0.mlp.c_fc.weight": 3})
	require.EqualError(t, err, `optim: AdamW has no parameter "h.0.mlp.c_fc.weight" to set the step count of (was the state saved from another model?)`)
}

// TestStepScaled: the step on gradients times s, folded into AdamW's
// update, is bitwise the step after ScaleGrads, in float32 and float64,
// and leaves the gradients as they were; an optimizer without the fold
// (SGD) has its gradients scaled first.
func TestStepScaled(t *testing.T) {
	const s = 0.37 / 65536
	of := func(dt tensor.DType, v ...float64) *tensor.Tensor {
		if dt == tensor.Float64 {
			return tensor.FromF64(v, len(v))
		}
		f := make([]float32, len(v))
		for i, x := range v {
			f[i] = float32(x)
		}
		return tensor.FromF32(f, len(v))
	}
	for _, dt := range []tensor.DType{tensor.Float32, tensor.Float64} {
		mk := func() (*tensor.Tensor, *AdamW) {
			p := of(dt, 1, -2, 0.5)
			return p, NewAdamW(AdamWConfig{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}, []Group{{Params: []*tensor.Tensor{p}, WeightDecay: 0.1}}, nil)
		}
		p1, o1 := mk()
		p2, o2 := mk()
		for step := 1; step <= 3; step++ {
			g := of(dt, 3e4, -1e3*float64(step), 7)
			p1.Grad = g.Clone(tensor.Grads)
			require.NoError(t, StepScaled(o1, 1e-2, s))
			require.Equal(t, g.Float64s(), p1.Grad.Float64s(), "%s: the gradient is left as it was", dt)
			p2.Grad = g.Clone(tensor.Grads)
			ScaleGrads([]*tensor.Tensor{p2}, s)
			require.NoError(t, o2.Step(1e-2))
			require.Equal(t, p2.Float64s(), p1.Float64s(), "%s step %d", dt, step)
		}
	}
	p := tensor.FromF64([]float64{1}, 1)
	p.Grad = tensor.FromF64([]float64{4}, 1)
	require.NoError(t, StepScaled(NewSGD(0, []Group{{Params: []*tensor.Tensor{p}}}, nil), 0.1, 0.5))
	require.InDelta(t, 1-0.1*2, p.At(0), 1e-15)
}
