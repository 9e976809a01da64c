package nn

import (
	"flag"
	"fmt"
	"math"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/tensor"
)

var updateMoE = flag.Bool("update", false, "rewrite the MoE reference outputs in testdata (needs /usr/bin/python3 with torch)")

// moeCase is one layer the PyTorch reference checks.
type moeCase struct {
	name string
	cfg  MoEConfig
	// skew adds to the router's column 0 so most tokens want expert 0
	// and a capacity drops some.
	skew float64
}

var moeCases = []moeCase{
	{"dropless", MoEConfig{Experts: 4, TopK: 2, Every: 1, AuxLossCoef: 0.1, ZLossCoef: 0.01}, 0},
	{"top1", MoEConfig{Experts: 3, TopK: 1, Every: 1, AuxLossCoef: 0.05, ZLossCoef: 0}, 0},
	{"capacity", MoEConfig{Experts: 4, TopK: 2, Every: 1, CapacityFactor: 1, AuxLossCoef: 0.1, ZLossCoef: 0.01}, 0.8},
}

const moeB, moeT, moeC = 2, 6, 8

// buildMoE makes a float64 layer of case c with every parameter random
// (biases too), an input x [B, T, C] that requires a gradient and the
// output gradient gout, all from fixed seeds.
func buildMoE(c moeCase) (*MoE, *tensor.Tensor, *tensor.Tensor, map[string]*tensor.Tensor) {
	mod := NewModule("h.0", "h.0")
	newP := func(local string, shape ...int) *tensor.Tensor {
		return mod.AddParam(local, tensor.Default.New(tensor.Params, tensor.Float64, shape...)).RequiresGrad()
	}
	m := newMoE(c.cfg, newP, moeC)
	byName := map[string]*tensor.Tensor{}
	for _, p := range mod.Params() {
		r := NewRand(7, p.Name)
		for i := 0; i < p.Numel(); i++ {
			p.Set(i, 0.5*r.Normal())
		}
	}
	for i := 0; i < moeC; i++ {
		m.Router.Set(i*c.cfg.Experts, m.Router.At(i*c.cfg.Experts)+c.skew)
	}
	for _, p := range mod.Params() {
		byName[p.Name[len("h.0."):]] = p
	}
	x := tensor.Default.New(tensor.Params, tensor.Float64, moeB, moeT, moeC).RequiresGrad()
	g := tensor.Default.New(tensor.Params, tensor.Float64, moeB, moeT, moeC)
	rx, rg := NewRand(3, "x"), NewRand(3, "gout")
	for i := 0; i < x.Numel(); i++ {
		x.Set(i, rx.Normal()+0.2)
		g.Set(i, rg.Normal())
	}
	return m, x, g, byName
}

// refInput is the reference's input file contents for case c: names as
// moe_ref.py reads them.
func refInput(c moeCase) (map[string]*tensor.Tensor, map[string]string) {
	m, x, g, byName := buildMoE(c)
	ts := map[string]*tensor.Tensor{
		"x":             x.Reshape(moeB*moeT, moeC),
		"gout":          g.Reshape(moeB*moeT, moeC),
		"router.weight": m.Router,
	}
	for name, p := range byName {
		if len(name) > len("mlp.") && name[:4] == "mlp." && name != "mlp.router.weight" {
			ts[name[len("mlp."):]] = p
		}
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	return ts, map[string]string{
		"top_k": strconv.Itoa(c.cfg.TopK), "capacity_factor": f(c.cfg.CapacityFactor),
		"aux_loss_coef": f(c.cfg.AuxLossCoef), "z_loss_coef": f(c.cfg.ZLossCoef),
	}
}

func torchAvailable() bool {
	return exec.Command("/usr/bin/python3", "-c", "import torch").Run() == nil
}

// runMoERef runs tools/torchref/moe_ref.py on case c and writes its output
// to out.
func runMoERef(t *testing.T, c moeCase, out string) {
	in := filepath.Join(t.TempDir(), "in.safetensors")
	ts, meta := refInput(c)
	require.NoError(t, ckpt.Save(in, ts, meta))
	b, err := exec.Command("/usr/bin/python3", "../../tools/torchref/moe_ref.py", "--in", in, "--out", out).CombinedOutput()
	require.NoError(t, err, "moe_ref.py: %s", b)
}

// The MoE layer against the PyTorch reference in float64: its output, the
// load-balancing and z losses, the dropped count, and the gradients of
// sum(out·gout) + aux + z with respect to the input, the router and every
// expert's weights, to 1e-10 relative. The committed outputs make it run
// without torch; where torch is installed it is recomputed live as well.
// `go test ./core/nn -run MoEMatchesTorch -update` rewrites them.
func TestMoEMatchesTorchReference(t *testing.T) {
	live := torchAvailable()
	for _, c := range moeCases {
		t.Run(c.name, func(t *testing.T) {
			committed := filepath.Join("testdata", "moe_ref_"+c.name+".safetensors")
			if *updateMoE {
				require.True(t, live, "-update needs /usr/bin/python3 with torch")
				runMoERef(t, c, committed)
			}
			refs := []string{committed}
			if live {
				fresh := filepath.Join(t.TempDir(), "out.safetensors")
				runMoERef(t, c, fresh)
				refs = append(refs, fresh)
			}
			for _, path := range refs {
				ref, _, err := ckpt.Load(path)
				require.NoError(t, err)
				checkMoEAgainst(t, c, ref)
			}
		})
	}
}

func checkMoEAgainst(t *testing.T, c moeCase, ref map[string]*tensor.Tensor) {
	m, x, g, byName := buildMoE(c)
	out, err := m.Forward(x, Pass{})
	require.NoError(t, err)
	_, err = tensor.Backward(out, g, tensor.BackwardOptions{})
	require.NoError(t, err)
	const tol = 1e-10
	assert.Less(t, relErr(out.Float64s(), ref["out"].Float64s()), tol, "output")
	assert.InDelta(t, ref["aux"].At(0), m.Stats.Aux, tol*math.Abs(ref["aux"].At(0))+1e-15, "aux loss")
	assert.InDelta(t, ref["z"].At(0), m.Stats.Z, tol*math.Abs(ref["z"].At(0))+1e-15, "z loss")
	assert.Equal(t, int64(ref["dropped"].At(0)), m.Stats.Dropped, "dropped assignments")
	if c.cfg.CapacityFactor > 0 {
		require.Positive(t, m.Stats.Dropped, "the capacity case must drop some")
	}
	assert.Less(t, relErr(x.Grad.Float64s(), ref["grad.x"].Float64s()), tol, "grad x")
	assert.Less(t, relErr(m.Router.Grad.Float64s(), ref["grad.router.weight"].Float64s()), tol, "grad router")
	for name, p := range byName {
		if name == "mlp.router.weight" {
			continue
		}
		want := ref["grad."+name[len("mlp."):]]
		require.NotNil(t, want, name)
		if p.Grad == nil {
			assert.Zero(t, normOf(want.Float64s()), "%s gets no gradient here but the reference's is nonzero", name)
			continue
		}
		assert.Less(t, relErr(p.Grad.Float64s(), want.Float64s()), tol, "grad %s", name)
	}
}

func relErr(got, want []float64) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	var d float64
	for i := range want {
		d += (got[i] - want[i]) * (got[i] - want[i])
	}
	return math.Sqrt(d) / math.Max(normOf(want), 1e-300)
}

func normOf(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x * x
	}
	return math.Sqrt(s)
}

// The capacity rule, fixed by hand: 4 tokens, 2 experts, top-2, capacity
// factor 0.5 gives each expert ceil(0.5·4·2/2) = 2 assignments. First
// choices by token go first (tokens 0, 1, 2 prefer expert 0, token 3
// expert 1): expert 0 fills with tokens 0 and 1, so token 2's first choice
// drops. Then second choices by token: expert 1 has room for one more,
// token 0's; tokens 1 and 2 (expert 1) and token 3 (expert 0) drop.
func TestMoECapacityDropsByChoiceThenToken(t *testing.T) {
	choice := []int{
		0, 1, // token 0
		0, 1, // token 1
		0, 1, // token 2
		1, 0, // token 3
	}
	cfg := MoEConfig{Experts: 2, TopK: 2, Every: 1, CapacityFactor: 0.5}
	require.Equal(t, 2, cfg.Capacity(4))
	r := Route(choice, 4, 2, 2, cfg.Capacity(4))
	assert.Equal(t, [][]int{{0, 1}, {0, 3}}, r.Rows, "tokens each expert keeps")
	assert.Equal(t, [][]int{{0, 2}, {1, 6}}, r.Weight, "their routing weights (t·k+s)")
	assert.Equal(t, []int{4, 4}, r.Count, "assignments before dropping")
	assert.Equal(t, 4, r.Dropped)
	// Dropless keeps every assignment, in token order.
	r = Route(choice, 4, 2, 2, 0)
	assert.Equal(t, [][]int{{0, 1, 2, 3}, {0, 1, 2, 3}}, r.Rows)
	assert.Equal(t, 0, r.Dropped)
}

func TestMoEConfigErrors(t *testing.T) {
	for _, c := range []struct {
		cfg  MoEConfig
		want string
	}{
		{MoEConfig{Experts: -1, TopK: 2, Every: 1}, "nn: model.moe.experts=-1: use 0 for a dense model or at least 1 expert"},
		{MoEConfig{Experts: 4, TopK: 5, Every: 1}, "nn: model.moe.top_k=5 must be between 1 and model.moe.experts=4"},
		{MoEConfig{Experts: 4, TopK: 2, Every: 0}, "nn: model.moe.every=0 must be at least 1"},
		{MoEConfig{Experts: 4, TopK: 2, Every: 1, CapacityFactor: -1}, "nn: model.moe.capacity_factor=-1 must be 0 (dropless) or positive"},
		{MoEConfig{Experts: 4, TopK: 2, Every: 1, AuxLossCoef: -0.1}, "nn: model.moe.aux_loss_coef=-0.1 and z_loss_coef=0 must not be negative"},
	} {
		assert.EqualError(t, c.cfg.Validate(), c.want, fmt.Sprint(c.cfg))
	}
	assert.NoError(t, MoEConfig{}.Validate(), "dense")
}

// A GPT whose second block is a mixture of experts: every parameter
// gradient, in float64, against central finite differences of the training
// loss, the language-model loss plus the blocks' load-balancing and z
// losses (read from the layer's statistics), which reach backward through
// the block's output.
func TestMoEGPTGradCheck(t *testing.T) {
	cfg := tiny()
	cfg.MoE = MoEConfig{Experts: 3, TopK: 2, Every: 2, AuxLossCoef: 0.2, ZLossCoef: 0.05}
	m, err := NewGPT(cfg, 3, tensor.Float64, nil)
	require.NoError(t, err)
	require.Nil(t, m.Blocks()[0].MoE, "block 0 stays dense with every=2")
	require.NotNil(t, m.Blocks()[1].MoE)
	var n int64
	var shapes []string
	for _, p := range m.Params() {
		n += int64(p.Numel())
		shapes = append(shapes, fmt.Sprint(p.Name, p.Shape()))
	}
	var want []string
	for _, s := range cfg.ParamShapes() {
		want = append(want, fmt.Sprint(s.Name, s.Shape))
	}
	assert.Equal(t, want, shapes, "ParamShapes lists what the model builds")
	assert.Equal(t, cfg.NumParams(), n, "NumParams counts what the model builds")
	C := int64(cfg.NEmbd)
	assert.Equal(t, cfg.NumParams()-(8*C*C+5*C), cfg.ActiveParams(), "top-2 of 3 experts: one MLP fewer per token")
	for _, p := range m.Params() {
		r := NewRand(11, p.Name)
		for i := 0; i < p.Numel(); i++ {
			p.Set(i, p.At(i)+0.3*r.Normal())
		}
	}
	moe := m.Blocks()[1].MoE
	idx := tensor.FromI32([]int32{1, 5, 3, 9, 0, 2, 4, 4, 7, 10, 6, 1}, 2, 6)
	tgt := tensor.FromI32([]int32{5, 3, 9, 0, 2, 8, 4, 7, 10, 6, 1, 3}, 2, 6)
	loss, err := m.Loss(idx, tgt, Pass{})
	require.NoError(t, err)
	_, err = tensor.Backward(loss, nil, tensor.BackwardOptions{})
	require.NoError(t, err)
	s := moe.TakeStats()
	require.Positive(t, s.Aux)
	require.Positive(t, s.Z)
	assert.Equal(t, int64(12*2), s.Load[0]+s.Load[1]+s.Load[2], "every token goes to two experts")
	f := func() float64 {
		l, err := m.Loss(idx, tgt, Pass{})
		require.NoError(t, err)
		st := moe.TakeStats()
		v := l.Scalar() + st.Aux + st.Z
		tensor.FreeGraph(l)
		return v
	}
	checkGradients(t, m.Params(), f)
}
