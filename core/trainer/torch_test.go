package trainer

import (
	"flag"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/data"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// The PyTorch equivalence test. The fixture's input file holds a tiny GPT-2
// as tinyacc initialises it, the sequential batches of 5 steps and the
// hyper-parameters; its output file is what tools/torchref/gpt2_ref.py (an
// independent PyTorch implementation) computed from that input: the loss of
// each step, the gradients of the first step and the final parameters.
//
// The committed output makes the comparison run without torch; where torch
// is installed the reference is recomputed live from the same input as
// well. `go test ./core/trainer -run Torch -update` rebuilds both files.

var update = flag.Bool("update", false, "rewrite the PyTorch fixture (needs /usr/bin/python3 with torch)")

const (
	fixtureIn  = "testdata/gpt2_ref_in.safetensors"
	fixtureOut = "testdata/gpt2_ref_out.safetensors"
	refSteps   = 5
)

// refText is the token stream of the test: bytes of some Go source.
const refText = `package main

import "fmt"

// fib returns the n-th Fibonacci number.
func fib(n int) int {
	if n < 2 {
		return n
	}
	return fib(n-1) + fib(n-2)
}

func main() {
	for i := 0; i < 10; i++ {
		fmt.Println(i, fib(i))
	}
}
`

func refConfig() config.Config {
	c := config.Defaults()
	c.Model.NLayer, c.Model.NHead, c.Model.NEmbd, c.Model.BlockSize, c.Model.VocabSize = 2, 2, 32, 16, 256
	c.Train.Steps, c.Train.BatchSize, c.Train.GradAccum = refSteps, 4, 1
	c.Train.LR, c.Train.Schedule = 1e-3, "constant"
	c.Train.WeightDecay, c.Train.GradClip = 0.1, 1.0
	c.Data.Order = "sequential"
	c.Data.ValFraction = 0
	return c
}

// gradGrabber copies the gradients at the first step's PreStep (before
// clipping), as the reference records them.
type gradGrabber struct{ grads map[string][]float64 }

func (g *gradGrabber) Name() string { return "grad-grabber" }
func (g *gradGrabber) PreStep(t *Trainer) error {
	if g.grads == nil {
		g.grads = map[string][]float64{}
		for _, p := range t.Model.Params() {
			g.grads[p.Name] = p.Grad.Float64s()
		}
	}
	return nil
}

func writeFixtureInput(t *testing.T, path string) {
	cfg := refConfig()
	tr, err := New(cfg, Options{Train: data.Encode(refText)})
	require.NoError(t, err)
	ts := map[string]*tensor.Tensor{}
	for _, p := range tr.Model.Params() {
		ts[p.Name] = p
	}
	B, T := cfg.Train.BatchSize, cfg.Model.BlockSize
	bx := make([]int32, 0, refSteps*B*T)
	by := make([]int32, 0, refSteps*B*T)
	for s := 0; s < refSteps; s++ {
		x, y := tr.Train.Batch(s, 0, 0, 1, B, 1)
		bx = append(bx, x.I32()...)
		by = append(by, y.I32()...)
	}
	ts["batch.x"] = tensor.FromI32(bx, refSteps, B, T)
	ts["batch.y"] = tensor.FromI32(by, refSteps, B, T)
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	meta := map[string]string{
		"n_layer": "2", "n_head": "2", "n_embd": "32", "block_size": "16", "vocab_size": "256",
		"lr": f(cfg.Train.LR), "beta1": f(cfg.Train.Beta1), "beta2": f(cfg.Train.Beta2), "eps": f(cfg.Train.Eps),
		"weight_decay": f(cfg.Train.WeightDecay), "grad_clip": f(cfg.Train.GradClip),
	}
	require.NoError(t, ckpt.Save(path, ts, meta))
}

func torchAvailable() bool {
	return exec.Command("/usr/bin/python3", "-c", "import torch").Run() == nil
}

func runTorchRef(t *testing.T, in, out string) {
	runScript(t, "../../tools/torchref/gpt2_ref.py", in, out)
}

// runScript runs a reference script of tools/torchref on in, writing out.
func runScript(t *testing.T, script, in, out string, args ...string) {
	cmd := exec.Command("/usr/bin/python3", append([]string{script, "--in", in, "--out", out}, args...)...)
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s: %s", script, b)
}

func normRel(got, want []float64) float64 {
	var d, r float64
	for i := range want {
		d += (got[i] - want[i]) * (got[i] - want[i])
		r += want[i] * want[i]
	}
	return math.Sqrt(d) / math.Max(math.Sqrt(r), 1e-30)
}

// compareWithReference trains our engine on the fixture input and holds it
// to a reference output file.
func compareWithReference(t *testing.T, refPath string) {
	in, _, err := ckpt.Load(fixtureIn)
	require.NoError(t, err)
	ref, _, err := ckpt.Load(refPath)
	require.NoError(t, err)

	cfg := refConfig()
	grab := &gradGrabber{}
	tr, err := New(cfg, Options{Train: data.Encode(refText), Plugins: []Plugin{grab}})
	require.NoError(t, err)
	for _, p := range tr.Model.Params() {
		src, ok := in[p.Name]
		require.True(t, ok, p.Name)
		p.CopyFrom(src)
	}
	B, T := cfg.Train.BatchSize, cfg.Model.BlockSize
	var worstLoss, worstGrad, worstParam float64
	for s := 0; s < refSteps; s++ {
		x, y := tr.Train.Batch(s, 0, 0, 1, B, 1)
		require.Equal(t, in["batch.x"].I32()[s*B*T:(s+1)*B*T], x.I32(), "step %d inputs", s)
		require.Equal(t, in["batch.y"].I32()[s*B*T:(s+1)*B*T], y.I32(), "step %d targets", s)
		m, err := tr.Step(s)
		require.NoError(t, err)
		want := ref["loss"].At(s)
		require.InEpsilon(t, want, m.Loss, 1e-5, "loss of step %d", s)
		worstLoss = math.Max(worstLoss, math.Abs(m.Loss-want)/want)
		require.InEpsilon(t, ref["grad_norm"].At(s), m.GradNorm, 1e-5, "grad norm of step %d", s)
	}
	for _, p := range tr.Model.Params() {
		g := ref["grad."+p.Name]
		require.NotNil(t, g, p.Name)
		ge := normRel(grab.grads[p.Name], g.Float64s())
		require.LessOrEqual(t, ge, 1e-5, "gradient of %s", p.Name)
		w := ref["param."+p.Name]
		pe := normRel(p.Float64s(), w.Float64s())
		if strings.HasSuffix(p.Name, ".attn.c_attn.bias") {
			// The key bias's gradient is zero in theory (softmax ignores a
			// shift shared by a query's scores), so AdamW moves its third of
			// this tensor by rounding noise, which depends on the CPU's BLAS
			// kernels: the key third differs from PyTorch's entirely and
			// lands near 1e-4 of the tensor. The tensor is allowed 1e-3 (as
			// the float32 equivalence rows allow it); its query and value
			// thirds are held to 1e-4.
			require.LessOrEqual(t, pe, 1e-3, "final %s", p.Name)
			got, want := p.Float64s(), w.Float64s()
			n := len(got) / 3
			require.LessOrEqual(t, normRel(got[:n], want[:n]), 1e-4, "final %s, query part", p.Name)
			require.LessOrEqual(t, normRel(got[2*n:], want[2*n:]), 1e-4, "final %s, value part", p.Name)
		} else {
			require.LessOrEqual(t, pe, 1e-4, "final %s", p.Name)
		}
		worstGrad, worstParam = math.Max(worstGrad, ge), math.Max(worstParam, pe)
	}
	t.Logf("vs PyTorch: worst loss rel error %.2e, worst gradient norm-wise error %.2e, worst final parameter error %.2e",
		worstLoss, worstGrad, worstParam)
}

func TestPyTorchEquivalenceFixture(t *testing.T) {
	if *update {
		if !torchAvailable() {
			t.Fatal("-update needs /usr/bin/python3 with torch")
		}
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		writeFixtureInput(t, fixtureIn)
		runTorchRef(t, fixtureIn, fixtureOut)
	}
	compareWithReference(t, fixtureOut)
}

func TestPyTorchEquivalenceLive(t *testing.T) {
	if !torchAvailable() {
		t.Skip("/usr/bin/python3 has no torch; the committed fixture still checks equivalence")
	}
	// A fresh input from today's initialisation, so the fixture cannot
	// hide a change in how the model is built.
	dir := t.TempDir()
	in := filepath.Join(dir, "in.safetensors")
	writeFixtureInput(t, in)
	ours, _, err := ckpt.Load(in)
	require.NoError(t, err)
	committed, _, err := ckpt.Load(fixtureIn)
	require.NoError(t, err)
	for name, tt := range committed {
		require.Equal(t, tt.Float64s(), ours[name].Float64s(), "fixture input %s differs from today's init and data; rerun with -update", name)
	}
	out := filepath.Join(dir, "out.safetensors")
	runTorchRef(t, in, out)
	compareWithReference(t, out)
}
