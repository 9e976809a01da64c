package nn

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/tensor"
)

func tiny() GPTConfig { return GPTConfig{NLayer: 2, NHead: 2, NEmbd: 8, BlockSize: 6, VocabSize: 11} }

func TestGPTNamesAndShapesAreHuggingFace(t *testing.T) {
	m, err := NewGPT(tiny(), 1, tensor.Float32, nil)
	require.NoError(t, err)
	want := []string{"wte.weight [11 8]", "wpe.weight [6 8]"}
	for i := 0; i < 2; i++ {
		p := fmt.Sprintf("h.%d.", i)
		want = append(want,
			p+"ln_1.weight [8]", p+"ln_1.bias [8]",
			p+"attn.c_attn.weight [8 24]", p+"attn.c_attn.bias [24]",
			p+"attn.c_proj.weight [8 8]", p+"attn.c_proj.bias [8]",
			p+"ln_2.weight [8]", p+"ln_2.bias [8]",
			p+"mlp.c_fc.weight [8 32]", p+"mlp.c_fc.bias [32]",
			p+"mlp.c_proj.weight [32 8]", p+"mlp.c_proj.bias [8]")
	}
	want = append(want, "ln_f.weight [8]", "ln_f.bias [8]")
	var got []string
	var n int64
	for _, p := range m.Params() {
		got = append(got, fmt.Sprintf("%s %v", p.Name, p.Shape()))
		n += int64(p.Numel())
	}
	require.Equal(t, want, got)
	require.Equal(t, n, tiny().NumParams())
	var listed []string
	for _, ps := range tiny().ParamShapes() {
		listed = append(listed, fmt.Sprintf("%s %v", ps.Name, ps.Shape))
	}
	require.Equal(t, want, listed, "ParamShapes lists what NewGPT builds")
	require.Same(t, m.Embed.Wte, m.Head.Wte, "the head is tied to wte")
}

func TestInitDependsOnlyOnSeedAndName(t *testing.T) {
	a, err := NewGPT(tiny(), 7, tensor.Float32, nil)
	require.NoError(t, err)
	// A deeper model shares the first blocks' names, so their weights
	// must be identical: init does not depend on what else is built.
	cfg := tiny()
	cfg.NLayer = 4
	b, err := NewGPT(cfg, 7, tensor.Float32, nil)
	require.NoError(t, err)
	for _, p := range a.Params() {
		q := b.Param(p.Name)
		require.NotNil(t, q)
		if strings.HasSuffix(p.Name, "c_proj.weight") {
			// residual projections are scaled by 1/sqrt(2·n_layer)
			ratio := q.At(0) / p.At(0)
			require.InDelta(t, math.Sqrt(2.0/4.0), ratio, 1e-6)
			continue
		}
		require.Equal(t, p.F32(), q.F32(), p.Name)
	}
	c, err := NewGPT(tiny(), 8, tensor.Float32, nil)
	require.NoError(t, err)
	require.NotEqual(t, a.Embed.Wte.F32(), c.Embed.Wte.F32(), "another seed, other weights")
}

func TestInitStatistics(t *testing.T) {
	cfg := GPTConfig{NLayer: 2, NHead: 4, NEmbd: 64, BlockSize: 32, VocabSize: 256}
	m, err := NewGPT(cfg, 1, tensor.Float64, nil)
	require.NoError(t, err)
	std := func(p *tensor.Tensor) float64 {
		var s float64
		for _, v := range p.F64() {
			s += v * v
		}
		return math.Sqrt(s / float64(p.Numel()))
	}
	require.InDelta(t, 0.02, std(m.Embed.Wte), 0.001)
	require.InDelta(t, 0.02, std(m.Param("h.0.mlp.c_fc.weight")), 0.001)
	require.InDelta(t, 0.02/math.Sqrt(4), std(m.Param("h.1.mlp.c_proj.weight")), 0.0005)
	require.Equal(t, 1.0, m.Blocks()[0].Ln1W.At(3))
	require.Equal(t, 0.0, m.Param("h.0.attn.c_attn.bias").At(5))
}

func TestModuleHooksFireInOrder(t *testing.T) {
	m, err := NewGPT(tiny(), 1, tensor.Float64, nil)
	require.NoError(t, err)
	var events []string
	for _, mod := range m.Modules()[1:3] { // the two blocks
		mod.Hooks.PreForward = append(mod.Hooks.PreForward, func(mm *Module, info tensor.PassInfo) {
			events = append(events, fmt.Sprintf("pre_fwd %s micro %d", mm.Name(), info.Micro))
		})
		mod.Hooks.PostForward = append(mod.Hooks.PostForward, func(mm *Module, info tensor.PassInfo) {
			events = append(events, "post_fwd "+mm.Name())
		})
		mod.Hooks.PreBackward = append(mod.Hooks.PreBackward, func(mm *Module, info tensor.PassInfo) {
			events = append(events, fmt.Sprintf("pre_bwd %s last %v", mm.Name(), info.Last))
		})
		mod.Hooks.PostBackward = append(mod.Hooks.PostBackward, func(mm *Module, info tensor.PassInfo) {
			events = append(events, "post_bwd "+mm.Name())
		})
	}
	var ready []string
	idx := tensor.FromI32([]int32{1, 2, 3, 4, 5, 6}, 1, 6)
	tgt := tensor.FromI32([]int32{2, 3, 4, 5, 6, 7}, 1, 6)
	loss, err := m.Loss(idx, tgt, Pass{Info: tensor.PassInfo{Micro: 1}})
	require.NoError(t, err)
	_, err = tensor.Backward(loss, nil, tensor.BackwardOptions{Info: tensor.PassInfo{Micro: 1, Last: true},
		GradReady: func(p *tensor.Tensor, _ tensor.PassInfo) {
			if p.Name == "h.1.ln_1.weight" || p.Name == "h.0.mlp.c_proj.weight" {
				ready = append(ready, p.Name)
			}
			if p.Name == "h.1.ln_1.weight" {
				events = append(events, "ready h.1.ln_1.weight")
			}
		}})
	require.NoError(t, err)
	require.Equal(t, []string{
		"pre_fwd h.0 micro 1", "post_fwd h.0",
		"pre_fwd h.1 micro 1", "post_fwd h.1",
		"pre_bwd h.1 last true",
		"ready h.1.ln_1.weight", // h.1's first op is its last in backward
		"post_bwd h.1",
		"pre_bwd h.0 last true", "post_bwd h.0",
	}, events)
	require.Equal(t, []string{"h.1.ln_1.weight", "h.0.mlp.c_proj.weight"}, ready)
}

// TestWholeGPTGradCheck holds every parameter gradient of a tiny GPT in
// float64 against central finite differences of the loss.
func TestWholeGPTGradCheck(t *testing.T) {
	m, err := NewGPT(tiny(), 3, tensor.Float64, nil)
	require.NoError(t, err)
	// Larger weights than GPT-2's init so every path carries signal.
	for _, p := range m.Params() {
		r := NewRand(11, p.Name)
		for i := 0; i < p.Numel(); i++ {
			p.Set(i, p.At(i)+0.3*r.Normal())
		}
	}
	idx := tensor.FromI32([]int32{1, 5, 3, 9, 0, 2, 4, 4, 7, 10, 6, 1}, 2, 6)
	tgt := tensor.FromI32([]int32{5, 3, 9, 0, 2, 8, 4, 7, 10, 6, 1, 3}, 2, 6)
	loss, err := m.Loss(idx, tgt, Pass{})
	require.NoError(t, err)
	_, err = tensor.Backward(loss, nil, tensor.BackwardOptions{})
	require.NoError(t, err)
	f := func() float64 {
		l, err := m.Loss(idx, tgt, Pass{})
		require.NoError(t, err)
		v := l.Scalar()
		tensor.FreeGraph(l)
		return v
	}
	checkGradients(t, m.Params(), f)
}

// checkGradients compares every parameter's gradient (nil: zero) with
// central finite differences of f, relative error norm-wise below 1e-6:
// every coordinate of small tensors, a stride through big ones.
func checkGradients(t *testing.T, params []*tensor.Tensor, f func() float64) {
	t.Helper()
	const h = 1e-5
	for _, p := range params {
		var diff, ref float64
		step := 1
		if p.Numel() > 64 {
			step = 7
		}
		for i := 0; i < p.Numel(); i += step {
			orig := p.At(i)
			p.Set(i, orig+h)
			fp := f()
			p.Set(i, orig-h)
			fm := f()
			p.Set(i, orig)
			num := (fp - fm) / (2 * h)
			var got float64
			if p.Grad != nil {
				got = p.Grad.At(i)
			}
			d := got - num
			diff += d * d
			ref += num * num
		}
		rel := math.Sqrt(diff) / math.Max(math.Sqrt(ref), 1e-12)
		require.Less(t, rel, 1e-6, "gradient of %s", p.Name)
	}
}

// TestPositionsReachEmbeddingAndAttention: the whole model run with
// explicit positions 0..T-1 equals the default pass, and the embedding of
// rows at other positions adds those positions' embeddings.
func TestPositionsReachEmbeddingAndAttention(t *testing.T) {
	m, err := NewGPT(tiny(), 3, tensor.Float64, nil)
	require.NoError(t, err)
	idx := tensor.FromI32([]int32{1, 5, 3, 9}, 1, 4)
	want, err := m.Logits(idx, Pass{})
	require.NoError(t, err)
	got, err := m.Logits(idx, Pass{Pos: []int{0, 1, 2, 3}})
	require.NoError(t, err)
	require.Equal(t, want.F64(), got.F64())
	x, err := m.Embed.Forward(idx, Pass{Pos: []int{0, 1, 4, 5}})
	require.NoError(t, err)
	C := tiny().NEmbd
	for r, p := range []int{0, 1, 4, 5} {
		for c := 0; c < C; c++ {
			require.Equal(t, m.Embed.Wte.At(int(idx.I32()[r])*C+c)+m.Embed.Wpe.At(p*C+c), x.At(r*C+c), "row %d col %d", r, c)
		}
	}
}

// TestInitJumpsToAnyElement: the generator computes element i directly,
// equal to walking the sequence, and a part filled through its placement
// holds exactly the whole tensor's elements at its global indices.
func TestInitJumpsToAnyElement(t *testing.T) {
	r := NewRand(7, "h.0.mlp.c_fc.weight")
	walk := NewRand(7, "h.0.mlp.c_fc.weight")
	for i := 0; i < 1000; i++ {
		require.Equal(t, walk.Normal(), r.NormalAt(i), "element %d", i)
	}
	cfg := GPTConfig{NLayer: 2, NHead: 2, NEmbd: 8, BlockSize: 4, VocabSize: 13}
	whole, err := NewGPT(cfg, 3, tensor.Float32, tensor.NewAllocator())
	require.NoError(t, err)
	for _, p := range whole.Params() {
		want := tensor.NewAllocator().New(tensor.Params, tensor.Float32, p.Shape()...)
		want.Name = p.Name
		std, v := cfg.initOf(p.Name)
		if std > 0 {
			FillNormal(want, 3, std)
		} else {
			Fill(want, v)
		}
		require.Equal(t, want.F32(), p.F32(), p.Name)
	}
	// Rows [5, 9) of wte, flattened and cut to elements [3, 20).
	spec := place.NewSpec("wte.weight", []int{13, 8})
	spec.Along[place.TP] = place.Placement{Kind: place.Shard, Dim: 0, Offset: 5, Length: 4}
	spec.Along[place.DP] = place.Placement{Kind: place.Flat, Offset: 3, Length: 17}
	c := place.Coord{Size: [place.NumAxes]int{1, 1, 1, 1}}
	part := tensor.NewAllocator().New(tensor.Params, tensor.Float32, 17)
	cfg.InitPart(3, spec, c, part)
	for k := 0; k < 17; k++ {
		require.Equal(t, whole.Embed.Wte.F32()[5*8+3+k], part.F32()[k], "element %d", k)
	}
}
