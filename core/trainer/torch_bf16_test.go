package trainer

import (
	"math"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/data"
)

// The engine's bf16 training against PyTorch's autocast bf16 on the same
// weights and batches (tools/torchref/gpt2_ref.py --autocast bf16
// --param_copies bf16). The reference reads the parameters as the engine
// does, as bf16 copies of float32 masters in every op (autocast alone keeps
// the embeddings, LayerNorm and the biases in float32). Both run every
// matrix product in bf16, the attention's forward and backward products
// included, but they still round in different places (autocast stores the
// products' outputs and weight gradients in bf16; the engine keeps
// product outputs and weight gradients in float32), so they agree to
// bf16's resolution, not bitwise (measured 1.6e-5 on losses and 4.4e-3 on
// gradients; 2.8e-5 and 4.4e-3 with only the attention's scores in bf16):
// each step's loss within 1e-2 relative, the first step's gradients within
// 5e-2 norm-wise per tensor. The gradients must also differ from PyTorch's
// float32 ones by more than float32 noise (1e-4), which a run that
// silently stayed in float32 would not.
func TestPyTorchAutocastBF16(t *testing.T) {
	if !torchAvailable() {
		t.Skip("/usr/bin/python3 has no torch")
	}
	dir := t.TempDir()
	in := filepath.Join(dir, "in.safetensors")
	writeFixtureInput(t, in)
	out := filepath.Join(dir, "out.safetensors")
	cmd := exec.Command("/usr/bin/python3", "../../tools/torchref/gpt2_ref.py", "--in", in, "--out", out, "--autocast", "bf16", "--param_copies", "bf16")
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "gpt2_ref.py: %s", b)

	inT, _, err := ckpt.Load(in)
	require.NoError(t, err)
	ref, _, err := ckpt.Load(out)
	require.NoError(t, err)
	f32ref, _, err := ckpt.Load(fixtureOut)
	require.NoError(t, err)

	cfg := refConfig()
	cfg.Train.MixedPrecision = "bf16"
	grab := &gradGrabber{}
	tr, err := New(cfg, Options{Train: data.Encode(refText), Plugins: []Plugin{grab}})
	require.NoError(t, err)
	for _, p := range tr.Model.Params() {
		p.CopyFrom(inT[p.Name])
	}
	B := cfg.Train.BatchSize
	var worstLoss, worstLossF32 float64
	for s := 0; s < refSteps; s++ {
		x, _ := tr.Train.Batch(s, 0, 0, 1, B, 1)
		require.Equal(t, inT["batch.x"].I32()[s*x.Numel():(s+1)*x.Numel()], x.I32(), "step %d inputs", s)
		m, err := tr.Step(s)
		require.NoError(t, err)
		want := ref["loss"].At(s)
		require.InEpsilon(t, want, m.Loss, 1e-2, "loss of step %d", s)
		worstLoss = math.Max(worstLoss, math.Abs(m.Loss-want)/want)
		worstLossF32 = math.Max(worstLossF32, math.Abs(m.Loss-f32ref["loss"].At(s))/f32ref["loss"].At(s))
	}
	var worstGrad, worstGradF32 float64
	for _, p := range tr.Model.Params() {
		ge := normRel(grab.grads[p.Name], ref["grad."+p.Name].Float64s())
		require.LessOrEqual(t, ge, 5e-2, "first-step gradient of %s", p.Name)
		worstGrad = math.Max(worstGrad, ge)
		worstGradF32 = math.Max(worstGradF32, normRel(grab.grads[p.Name], f32ref["grad."+p.Name].Float64s()))
	}
	require.Greater(t, worstGradF32, 1e-4, "the bf16 gradients differ from float32's by bf16 rounding, not float32 noise")
	t.Logf("bf16 vs PyTorch autocast bf16: worst loss rel error %.2e, worst gradient norm-wise error %.2e", worstLoss, worstGrad)
	t.Logf("bf16 vs PyTorch float32:       worst loss rel error %.2e, worst gradient norm-wise error %.2e", worstLossF32, worstGradF32)
}
