package trainer

import (
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/data"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// The Llama is held to tools/torchref/llama_ref.py, an independent
// PyTorch Llama written out by hand, on the same safetensors input: the
// engine's initial weights and batches. Losses, the first step's
// gradients and the weights after several AdamW steps (with weight decay
// and clipping) must match: in float64 to 1e-10, in float32 to 1e-5
// (losses, gradients) and 1e-4 (weights). The model has fewer key/value
// heads than query heads and an odd vocabulary, and runs tied and untied.

func llamaRefConfig(dtype string, tied bool) config.Config {
	c := refConfig()
	c.Model.Arch, c.Model.NHead, c.Model.NKVHead, c.Model.VocabSize = "llama", 4, 2, 259
	c.Model.IntermediateSize, c.Model.RopeTheta, c.Model.NormEps, c.Model.TieEmbeddings = 80, 500, 1e-6, tied
	c.Train.DType = dtype
	return c
}

func runLlamaRef(t *testing.T, cfg config.Config) {
	ref, tr, grab := llamaAgainstRef(t, cfg)
	lossTol, gradTol, paramTol := 1e-5, 1e-5, 1e-4
	if cfg.Train.DType == "float64" {
		lossTol, gradTol, paramTol = 1e-10, 1e-10, 1e-10
	}
	var worst [3]float64
	for s := 0; s < refSteps; s++ {
		m, err := tr.Step(s)
		require.NoError(t, err)
		want := ref["loss"].At(s)
		e := math.Abs(m.Loss-want) / want
		require.LessOrEqual(t, e, lossTol, "loss of step %d: %v, torch %v", s, m.Loss, want)
		require.InEpsilon(t, ref["grad_norm"].At(s), m.GradNorm, lossTol, "grad norm of step %d", s)
		worst[0] = math.Max(worst[0], e)
	}
	names := 0
	for _, p := range tr.Model.Params() {
		g, w := ref["grad."+p.Name], ref["param."+p.Name]
		require.NotNil(t, g, "torch has no gradient of %s", p.Name)
		ge, pe := normRel(grab.grads[p.Name], g.Float64s()), normRel(p.Float64s(), w.Float64s())
		require.LessOrEqual(t, ge, gradTol, "first-step gradient of %s", p.Name)
		require.LessOrEqual(t, pe, paramTol, "final %s", p.Name)
		worst[1], worst[2] = math.Max(worst[1], ge), math.Max(worst[2], pe)
		names++
	}
	require.Equal(t, len(ref)-2, 2*names, "torch's parameters and the engine's differ in number")
	t.Logf("%s tied=%v vs PyTorch: worst loss %.1e, gradient %.1e, final weight %.1e", cfg.Train.DType, cfg.Model.TieEmbeddings, worst[0], worst[1], worst[2])
}

// llamaAgainstRef writes the engine's initial weights and batches for cfg,
// runs the PyTorch Llama on them with args, and returns its results and a
// fresh trainer of cfg (its weights the same) with a gradient grabber.
func llamaAgainstRef(t *testing.T, cfg config.Config, args ...string) (map[string]*tensor.Tensor, *Trainer, *gradGrabber) {
	if !torchAvailable() {
		t.Skip("/usr/bin/python3 has no torch")
	}
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.safetensors"), filepath.Join(dir, "out.safetensors")
	tr, err := New(cfg, Options{Train: data.Encode(refText)})
	require.NoError(t, err)
	ts := map[string]*tensor.Tensor{}
	for _, p := range tr.Model.Params() {
		ts[p.Name] = p
	}
	ts["batch.x"], ts["batch.y"] = refBatches(tr, cfg)
	meta := llamaRefMeta(cfg)
	require.NoError(t, ckpt.Save(in, ts, meta))
	runScript(t, "../../tools/torchref/llama_ref.py", in, out, args...)
	ref, _, err := ckpt.Load(out)
	require.NoError(t, err)
	grab := &gradGrabber{}
	tr, err = New(cfg, Options{Train: data.Encode(refText), Plugins: []Plugin{grab}})
	require.NoError(t, err)
	return ref, tr, grab
}

func TestLlamaPyTorchEquivalence(t *testing.T) {
	for _, dtype := range []string{"float64", "float32"} {
		for _, tied := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s tied=%v", dtype, tied), func(t *testing.T) { runLlamaRef(t, llamaRefConfig(dtype, tied)) })
		}
	}
}

// A Llama's bf16 training against the PyTorch Llama under autocast bf16
// with bf16 parameter copies (llama_ref.py --autocast bf16 --param_copies
// bf16), on the same weights and batches, with the bounds GPT-2's is held
// to (TestPyTorchAutocastBF16): each step's loss within 1e-2 relative,
// the first step's gradients within 5e-2 norm-wise per tensor, and the
// gradients further from PyTorch's float32 ones than float32 noise (1e-4).
// Both round every product's operands to bf16; they round elsewhere
// differently (autocast keeps the SwiGLU gate, RoPE's products and the
// products' outputs in bf16, the engine in float32).
func TestLlamaPyTorchAutocastBF16(t *testing.T) {
	cfg := llamaRefConfig("float32", false)
	ref, _, _ := llamaAgainstRef(t, cfg)
	cfg.Train.MixedPrecision = "bf16"
	auto, tr, grab := llamaAgainstRef(t, cfg, "--autocast", "bf16", "--param_copies", "bf16")
	var worstLoss, worstGrad, worstF32, autoF32 float64
	for s := 0; s < refSteps; s++ {
		m, err := tr.Step(s)
		require.NoError(t, err)
		want := auto["loss"].At(s)
		require.InEpsilon(t, want, m.Loss, 1e-2, "loss of step %d", s)
		worstLoss = math.Max(worstLoss, math.Abs(m.Loss-want)/want)
	}
	for _, p := range tr.Model.Params() {
		ge := normRel(grab.grads[p.Name], auto["grad."+p.Name].Float64s())
		require.LessOrEqual(t, ge, 5e-2, "first-step gradient of %s", p.Name)
		worstGrad = math.Max(worstGrad, ge)
		worstF32 = math.Max(worstF32, normRel(grab.grads[p.Name], ref["grad."+p.Name].Float64s()))
		autoF32 = math.Max(autoF32, normRel(auto["grad."+p.Name].Float64s(), ref["grad."+p.Name].Float64s()))
	}
	require.Greater(t, worstF32, 1e-4, "the bf16 gradients differ from float32's by bf16 rounding, not float32 noise")
	t.Logf("llama bf16 vs PyTorch autocast bf16: worst loss %.2e, gradient %.2e; against PyTorch float32: gradient %.2e (autocast's own: %.2e)",
		worstLoss, worstGrad, worstF32, autoF32)
}

// refBatches is the trainer's first refSteps batches, [refSteps, B, T]
// inputs and targets, as the PyTorch reference reads them.
func refBatches(tr *Trainer, cfg config.Config) (x, y *tensor.Tensor) {
	B, T := cfg.Train.BatchSize, cfg.Model.BlockSize
	var bx, by []int32
	for s := 0; s < refSteps; s++ {
		x, y := tr.Train.Batch(s, 0, 0, 1, B, 1)
		bx, by = append(bx, x.I32()...), append(by, y.I32()...)
	}
	return tensor.FromI32(bx, refSteps, B, T), tensor.FromI32(by, refSteps, B, T)
}

// llamaRefMeta is the Llama reference's metadata: cfg's model shape and
// optimizer settings, numbers written exactly.
func llamaRefMeta(cfg config.Config) map[string]string {
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	m := cfg.Model
	return map[string]string{
		"n_layer": strconv.Itoa(m.NLayer), "n_head": strconv.Itoa(m.NHead), "n_kv_head": strconv.Itoa(m.NKVHead),
		"n_embd": strconv.Itoa(m.NEmbd), "intermediate_size": strconv.Itoa(m.IntermediateSize),
		"block_size": strconv.Itoa(m.BlockSize), "vocab_size": strconv.Itoa(m.VocabSize), "rope_theta": f(m.RopeTheta),
		"norm_eps": f(m.NormEps), "tie_embeddings": strconv.FormatBool(m.TieEmbeddings),
		"lr": f(cfg.Train.LR), "beta1": f(cfg.Train.Beta1), "beta2": f(cfg.Train.Beta2), "eps": f(cfg.Train.Eps),
		"weight_decay": f(cfg.Train.WeightDecay), "grad_clip": f(cfg.Train.GradClip),
	}
}
