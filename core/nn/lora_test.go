package nn

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/tensor"
)

func tinyLlama() GPTConfig {
	c := tiny()
	c.NEmbd, c.NHead = 8, 4
	c.Llama = &LlamaShape{NKVHead: 2, Intermediate: 12, RopeTheta: 10000, NormEps: 1e-5}
	return c
}

// withLoRA is c with adapters of rank 2 on targets.
func withLoRA(c GPTConfig, targets ...string) GPTConfig {
	c.LoRA = &LoRAShape{Rank: 2, Alpha: 3, Targets: targets}
	return c
}

// TestLoRAStartsAtTheBase: B = 0, so a model with adapters computes
// bitwise the logits of its base (same seed), and its base parameters
// are the base model's; A is drawn in ±1/√in, not all zero; the base
// takes no gradient, the adapters do.
func TestLoRAStartsAtTheBase(t *testing.T) {
	idx := tensor.FromI32([]int32{1, 5, 3, 9, 0, 2}, 1, 6)
	for _, c := range []struct {
		base    GPTConfig
		targets []string
		adapted int
	}{
		{tiny(), []string{"c_attn", "c_proj", "c_fc"}, 4},
		{tinyLlama(), []string{"q_proj", "v_proj", "o_proj", "up_proj", "down_proj"}, 5},
	} {
		base, err := NewGPT(c.base, 3, tensor.Float64, nil)
		require.NoError(t, err)
		cfg := withLoRA(c.base, c.targets...)
		m, err := NewGPT(cfg, 3, tensor.Float64, nil)
		require.NoError(t, err)
		require.Len(t, cfg.Adapted(), c.adapted)
		require.Len(t, m.Params(), len(base.Params())+2*c.adapted*c.base.NLayer)
		require.Equal(t, cfg.BaseShapes(), base.Config.ParamShapes())
		var shapes []ParamShape
		for _, p := range m.Params() {
			shapes = append(shapes, ParamShape{p.Name, p.Shape()})
			if q := base.Param(p.Name); q != nil {
				require.Equal(t, q.F64(), p.F64(), p.Name)
				require.False(t, p.NeedsGrad(), "frozen %s", p.Name)
				continue
			}
			require.True(t, IsAdapter(p.Name), p.Name)
			require.True(t, p.NeedsGrad(), p.Name)
			bound := 1 / math.Sqrt(float64(p.Dim(1)))
			var nonzero int
			for _, v := range p.F64() {
				if p.Dim(0) == cfg.LoRA.Rank { // A [r, in]
					require.True(t, v >= -bound && v < bound, "%s element %v outside ±%v", p.Name, v, bound)
				} else {
					require.Zero(t, v, "B starts at zero: %s", p.Name)
				}
				if v != 0 {
					nonzero++
				}
			}
			if p.Dim(0) == cfg.LoRA.Rank {
				require.Greater(t, nonzero, p.Numel()/2, p.Name)
			}
		}
		require.Equal(t, cfg.ParamShapes(), shapes, "ParamShapes lists the model's parameters in order")
		want, err := base.Logits(idx, Pass{})
		require.NoError(t, err)
		got, err := m.Logits(idx, Pass{})
		require.NoError(t, err)
		require.Equal(t, want.F64(), got.F64())
	}
}

// TestLoRAGradCheck: with nonzero B, the adapters' gradients (and the
// biases' under TrainBiases) match central finite differences of the
// loss in float64, for GPT-2's Conv1D layers and a Llama's fused q|k|v
// and gate|up; frozen parameters get none.
func TestLoRAGradCheck(t *testing.T) {
	idx := tensor.FromI32([]int32{1, 5, 3, 9, 0, 2, 4, 4, 7, 10, 6, 1}, 2, 6)
	tgt := tensor.FromI32([]int32{5, 3, 9, 0, 2, 8, 4, 7, 10, 6, 1, 3}, 2, 6)
	gpt := withLoRA(tiny(), "c_attn", "c_proj", "c_fc")
	gpt.LoRA.TrainBiases = true
	dropped := withLoRA(tiny(), "c_attn", "c_proj")
	dropped.LoRA.Dropout, dropped.LoRA.Seed = 0.3, 5
	// A training pass: the dropout mask is drawn from the step and the
	// elements' places, the same at every evaluation of the loss.
	train := Pass{Info: tensor.PassInfo{Train: true, Step: 3, Sample0: 2}}
	for _, cfg := range []GPTConfig{gpt, withLoRA(tinyLlama(), "q_proj", "v_proj", "o_proj", "up_proj", "down_proj"), dropped} {
		pass := Pass{}
		if cfg.LoRA.Dropout > 0 {
			pass = train
		}
		m, err := NewGPT(cfg, 3, tensor.Float64, nil)
		require.NoError(t, err)
		for _, p := range m.Params() {
			r := NewRand(11, p.Name)
			for i := 0; i < p.Numel(); i++ {
				p.Set(i, p.At(i)+0.3*r.Normal())
			}
		}
		loss, err := m.Loss(idx, tgt, pass)
		require.NoError(t, err)
		if cfg.LoRA.Dropout > 0 {
			plain, err := m.Loss(idx, tgt, Pass{})
			require.NoError(t, err)
			require.NotEqual(t, plain.Scalar(), loss.Scalar(), "dropout changes a training pass")
			tensor.FreeGraph(plain)
		}
		_, err = tensor.Backward(loss, nil, tensor.BackwardOptions{})
		require.NoError(t, err)
		var trained []*tensor.Tensor
		for _, p := range m.Params() {
			if p.NeedsGrad() {
				trained = append(trained, p)
			} else {
				require.Nil(t, p.Grad, p.Name)
			}
		}
		require.Equal(t, trained, m.TrainedParams())
		f := func() float64 {
			l, err := m.Loss(idx, tgt, pass)
			require.NoError(t, err)
			v := l.Scalar()
			tensor.FreeGraph(l)
			return v
		}
		checkGradients(t, trained, f)
	}
}

// A LoRA step forms no weight gradient of the base: 4Ψ per token for the
// base, 6 per adapter parameter, attention as before.
func TestLoRAFLOPs(t *testing.T) {
	c := tiny()
	full := c.FLOPsPerToken()
	l := withLoRA(c, "c_attn")
	C, r, L := float64(c.NEmbd), 2.0, float64(c.NLayer)
	psi := float64(c.NumParams())
	require.Equal(t, full-2*psi+6*L*(r*C+3*C*r), l.FLOPsPerToken())
}
