package trainer

import (
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/data"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// loraRefConfig is the PyTorch test's model in float64 with adapters on
// c_attn (column-like, fused) and both c_proj.
func loraRefConfig(biases string) config.Config {
	c := refConfig()
	c.Train.DType = "float64"
	c.LoRA.Rank, c.LoRA.Alpha, c.LoRA.Targets, c.LoRA.TrainBiases = 4, 8, []string{"c_attn", "c_proj"}, biases
	return c
}

// stepGrabber copies the gradients at PreStep of one step.
type stepGrabber struct {
	step, seen int
	grads      map[string][]float64
}

func (g *stepGrabber) Name() string { return "step-grabber" }
func (g *stepGrabber) PreStep(t *Trainer) error {
	if g.seen == g.step {
		g.grads = map[string][]float64{}
		for _, p := range t.Model.Params() {
			if p.Grad != nil {
				g.grads[p.Name] = p.Grad.Float64s()
			}
		}
	}
	g.seen++
	return nil
}

// TestLoRAAgainstPyTorch trains adapters in float64 beside a frozen GPT-2
// and holds every step's loss and gradient norm, the last step's adapter
// gradients and the final adapters to the PyTorch reference (adapters as
// PEFT builds them), to 1e-9. The base weights end bitwise as they
// started and never had a gradient; the optimizer holds the adapters
// only.
func TestLoRAAgainstPyTorch(t *testing.T) {
	if !torchAvailable() {
		t.Skip("/usr/bin/python3 has no torch")
	}
	for _, biases := range []string{"none", "all"} {
		t.Run("train_biases="+biases, func(t *testing.T) {
			cfg := loraRefConfig(biases)
			grab := &stepGrabber{step: refSteps - 1}
			tr, err := New(cfg, Options{Train: data.Encode(refText), Plugins: []Plugin{grab}})
			require.NoError(t, err)
			ts := map[string]*tensor.Tensor{}
			start := map[string][]float64{}
			var adapters int
			for _, p := range tr.Model.Params() {
				ts[p.Name] = p.Clone(tensor.Params)
				start[p.Name] = p.Float64s()
				if nn.IsAdapter(p.Name) {
					adapters++
					require.True(t, p.NeedsGrad(), p.Name)
				} else {
					require.Equal(t, biases == "all" && strings.HasSuffix(p.Name, ".bias"), p.NeedsGrad(), p.Name)
				}
			}
			require.Equal(t, 2*3*cfg.Model.NLayer, adapters, "c_attn, attn.c_proj and mlp.c_proj of each block")
			B, T := cfg.Train.BatchSize, cfg.Model.BlockSize
			var bx, by []int32
			for s := 0; s < refSteps; s++ {
				x, y := tr.Train.Batch(s, 0, 0, 1, B, 1)
				bx, by = append(bx, x.I32()...), append(by, y.I32()...)
			}
			ts["batch.x"], ts["batch.y"] = tensor.FromI32(bx, refSteps, B, T), tensor.FromI32(by, refSteps, B, T)
			f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
			meta := map[string]string{
				"n_layer": "2", "n_head": "2", "n_embd": "32", "block_size": "16", "vocab_size": "256",
				"lr": f(cfg.Train.LR), "beta1": f(cfg.Train.Beta1), "beta2": f(cfg.Train.Beta2), "eps": f(cfg.Train.Eps),
				"weight_decay": f(cfg.Train.WeightDecay), "grad_clip": f(cfg.Train.GradClip),
				"lora_rank": "4", "lora_alpha": "8", "lora_targets": "c_attn,c_proj", "lora_train_biases": biases,
				"grad_step": strconv.Itoa(refSteps - 1),
			}
			dir := t.TempDir()
			in, out := filepath.Join(dir, "in.safetensors"), filepath.Join(dir, "out.safetensors")
			require.NoError(t, ckpt.Save(in, ts, meta))
			runTorchRef(t, in, out)
			ref, _, err := ckpt.Load(out)
			require.NoError(t, err)

			var worst float64
			for s := 0; s < refSteps; s++ {
				m, err := tr.Step(s)
				require.NoError(t, err)
				require.InEpsilon(t, ref["loss"].At(s), m.Loss, 1e-9, "loss of step %d", s)
				require.InEpsilon(t, ref["grad_norm"].At(s), m.GradNorm, 1e-9, "grad norm of step %d", s)
				worst = math.Max(worst, math.Abs(m.Loss-ref["loss"].At(s))/ref["loss"].At(s))
			}
			var trained int
			for _, p := range tr.Model.Params() {
				g := ref["grad."+p.Name]
				if !p.NeedsGrad() {
					require.Nil(t, g, "the reference has no gradient for frozen %s", p.Name)
					require.Nil(t, p.Grad, "frozen %s has no gradient", p.Name)
					require.Equal(t, start[p.Name], p.Float64s(), "frozen %s is bitwise unchanged", p.Name)
					continue
				}
				trained++
				require.NotNil(t, g, p.Name)
				require.NotZero(t, normRel(make([]float64, g.Numel()), g.Float64s()), "a nonzero gradient of %s", p.Name)
				require.LessOrEqual(t, normRel(grab.grads[p.Name], g.Float64s()), 1e-9, "last-step gradient of %s", p.Name)
				require.LessOrEqual(t, normRel(p.Float64s(), ref["param."+p.Name].Float64s()), 1e-9, "final %s", p.Name)
			}
			require.Len(t, tr.Opt.Params(), trained, "the optimizer updates the trained parameters only")
			var stateElems, trainedElems int
			for _, s := range tr.Opt.State() {
				stateElems += s.Numel()
			}
			for _, p := range tr.Opt.Params() {
				trainedElems += p.Numel()
			}
			require.Equal(t, 2*trainedElems, stateElems, "AdamW's two moments of the trained parameters, nothing of the base")
			t.Logf("LoRA vs PyTorch float64: worst loss rel error %.1e", worst)
		})
	}
}

// TestLoRAMemory: one process under LoRA allocates gradients and
// optimizer state for the adapters only, exactly their bytes, and the
// estimate says the same; the parameters are the base's plus theirs.
func TestLoRAMemory(t *testing.T) {
	cfg := refConfig()
	cfg.Train.Steps = 2
	cfg.LoRA.Rank, cfg.LoRA.Targets = 4, []string{"c_attn", "mlp.c_fc"}
	tr, err := New(cfg, Options{Train: data.Encode(refText)})
	require.NoError(t, err)
	for s := 0; s < 2; s++ {
		_, err := tr.Step(s)
		require.NoError(t, err)
	}
	m := GPTConfig(cfg)
	C, r, L := cfg.Model.NEmbd, cfg.LoRA.Rank, cfg.Model.NLayer
	adapters := int64(4 * L * (r*C + 3*C*r + r*C + 4*C*r)) // float32 A and B of c_attn and c_fc
	require.Equal(t, adapters, 4*Numel(m.TrainedShapes()))
	got := tr.Memory()
	require.Equal(t, adapters, got.GradsBytes, "gradients of the adapters only")
	require.Equal(t, 2*adapters, got.OptimBytes, "AdamW's two moments of the adapters only")
	require.Equal(t, 4*Numel(m.ParamShapes()), got.ParamsBytes, "the base and the adapters")
	es, err := EstimateMemory(cfg, 1, 1, nil)
	require.NoError(t, err)
	require.Equal(t, got.GradsBytes, es[0].GradsBytes)
	require.Equal(t, got.OptimBytes, es[0].OptimBytes)
	require.Equal(t, got.ParamsBytes, es[0].ParamsBytes)
}
