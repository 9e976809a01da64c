package trainer

import (
	"context"
	"encoding/json"
	"fmt"
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

// mergeCheck is numpy's merge of a PEFT adapter directory into a base
// weights file, computed from the raw files alone: for every lora_A of
// module M, W = base[M.weight] + lora_alpha/r · (B @ A), transposed for
// fan_in_fan_out; every other tensor is the base's (or, with bias=all, the
// adapter file's bias). It prints the largest difference from the file
// the engine merged.
const mergeCheck = `
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import safetensors_np as st
base, _ = st.load_file(sys.argv[2])
ad, _ = st.load_file(sys.argv[3] + "/adapter_model.safetensors")
cfg = json.load(open(sys.argv[3] + "/adapter_config.json"))
got, _ = st.load_file(sys.argv[4])
want = {k: v.astype(np.float64) for k, v in base.items()}
scale = cfg["lora_alpha"] / cfg["r"]
pre = "base_model.model.transformer."
for k, a in ad.items():
    name = k[len(pre):]
    if name.endswith(".lora_A.weight"):
        m = name[: -len(".lora_A.weight")]
        b = ad[pre + m + ".lora_B.weight"]
        d = scale * (b.astype(np.float64) @ a.astype(np.float64))
        want[m + ".weight"] = want[m + ".weight"] + (d.T if cfg["fan_in_fan_out"] else d)
    elif name.endswith(".bias"):
        want[name] = a.astype(np.float64)
assert sorted(want) == sorted(got), (sorted(want), sorted(got))
print(max(float(np.max(np.abs(want[k] - got[k].astype(np.float64)))) for k in want))
`

// TestLoRAExport trains adapters on a base file, checkpoints them and
// exports them: --lora as PEFT lays them out (names, shapes, the config's
// r, lora_alpha, target_modules, fan_in_fan_out), --merge-lora as the
// base plus (alpha/rank)·B·A, which numpy computes again from the raw
// files. A plain export of the checkpoint says to use one of the two.
func TestLoRAExport(t *testing.T) {
	dir := t.TempDir()
	basePath := filepath.Join(dir, "base.safetensors")
	cfg := refConfig()
	m, err := BuildModel(cfg, nil)
	require.NoError(t, err)
	require.NoError(t, SaveWeights(m, basePath))

	cfg.Train.Steps, cfg.InitFrom, cfg.Checkpoint.Dir, cfg.SaveTo = 3, basePath, filepath.Join(dir, "ckpt"), filepath.Join(dir, "adapters.safetensors")
	cfg.LoRA.Rank, cfg.LoRA.Alpha, cfg.LoRA.Targets, cfg.LoRA.TrainBiases = 4, 8, []string{"c_attn", "mlp.c_proj"}, "all"
	tr, err := New(cfg, Options{Train: data.Encode(refText)})
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.NoError(t, err)
	step := filepath.Join(cfg.Checkpoint.Dir, ckpt.StepDir(3))

	// save_to holds what trains and names the base.
	saved, meta, err := ckpt.Load(cfg.SaveTo)
	require.NoError(t, err)
	require.Len(t, saved, len(GPTConfig(cfg).TrainedShapes()))
	digest, err := BaseDigest(cfg)
	require.NoError(t, err)
	require.Equal(t, digest, meta[MetaLoRABase])
	l, base, ok, err := LoRAOf(meta)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, digest, base)
	require.Equal(t, &nn.LoRAShape{Rank: 4, Alpha: 8, Targets: []string{"c_attn", "mlp.c_proj"}, TrainBiases: true}, l)

	out := filepath.Join(dir, "peft")
	require.NoError(t, ExportLoRA(step, out))
	ad, _, err := ckpt.Load(filepath.Join(out, AdapterWeightsFile))
	require.NoError(t, err)
	C, r := cfg.Model.NEmbd, 4
	want := map[string][]int{}
	for i := 0; i < cfg.Model.NLayer; i++ {
		p := fmt.Sprintf("base_model.model.transformer.h.%d.", i)
		want[p+"attn.c_attn.lora_A.weight"], want[p+"attn.c_attn.lora_B.weight"] = []int{r, C}, []int{3 * C, r}
		want[p+"mlp.c_proj.lora_A.weight"], want[p+"mlp.c_proj.lora_B.weight"] = []int{r, 4 * C}, []int{C, r}
		for _, b := range []string{"ln_1.bias", "attn.c_attn.bias", "attn.c_proj.bias", "ln_2.bias", "mlp.c_fc.bias", "mlp.c_proj.bias"} {
			want[p+b] = []int{map[bool]int{true: 3 * C, false: C}[b == "attn.c_attn.bias"]}
		}
		want[p+"mlp.c_fc.bias"] = []int{4 * C}
	}
	want["base_model.model.transformer.ln_f.bias"] = []int{C}
	got := map[string][]int{}
	for name, v := range ad {
		got[name] = v.Shape()
	}
	require.Equal(t, want, got)
	var pc map[string]any
	require.NoError(t, json.Unmarshal(must(os.ReadFile(filepath.Join(out, AdapterConfigFile))), &pc))
	require.Equal(t, "LORA", pc["peft_type"])
	require.Equal(t, 4.0, pc["r"])
	require.Equal(t, 8.0, pc["lora_alpha"])
	require.Equal(t, []any{"c_attn", "mlp.c_proj"}, pc["target_modules"])
	require.Equal(t, true, pc["fan_in_fan_out"])
	require.Equal(t, "all", pc["bias"])

	merged := filepath.Join(dir, "merged.safetensors")
	require.NoError(t, ExportMerged(step, "", merged))
	err = ExportCheckpoint(step, filepath.Join(dir, "plain.safetensors"))
	require.EqualError(t, err, "export: "+step+" holds LoRA adapters, not a model: export them with --lora (a PEFT adapter directory) or --merge-lora (the base with them merged in)")
	other := filepath.Join(dir, "other.safetensors")
	cfg2 := refConfig()
	cfg2.Train.Seed = 5
	m2, err := BuildModel(cfg2, nil)
	require.NoError(t, err)
	require.NoError(t, SaveWeights(m2, other))
	require.ErrorContains(t, ExportMerged(step, other, merged), "give that base with --base FILE")

	if exec.Command("/usr/bin/python3", "-c", "import numpy").Run() != nil {
		t.Skip("/usr/bin/python3 has no numpy")
	}
	b, err := exec.Command("/usr/bin/python3", "-c", mergeCheck, "../../tools/torchref", basePath, out, merged).CombinedOutput()
	require.NoError(t, err, "%s", b)
	diff, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	require.NoError(t, err, "%s", b)
	require.Less(t, diff, 1e-6, "merged weights against numpy's merge (float32 files)")
	t.Logf("merged weights vs numpy: largest difference %.2e", diff)
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestLoRADropoutOnlyInTraining: evaluation runs without the adapters'
// dropout: after training with it, the validation loss is bitwise the one
// the same weights give with dropout off.
func TestLoRADropoutOnlyInTraining(t *testing.T) {
	cfg := refConfig()
	cfg.Train.Steps, cfg.Train.EvalBatches = 2, 1
	cfg.LoRA.Rank, cfg.LoRA.Dropout = 4, 0.3
	tokens := data.Encode(refText)
	tr, err := New(cfg, Options{Train: tokens, Val: tokens})
	require.NoError(t, err)
	for s := 0; s < 2; s++ {
		_, err := tr.Step(s)
		require.NoError(t, err)
	}
	with, err := tr.Evaluate()
	require.NoError(t, err)
	n := 0
	for _, b := range tr.Model.Blocks() {
		for _, a := range nn.Adapters(b.Attn) {
			require.Equal(t, 0.3, a.Dropout)
			a.Dropout = 0
			n++
		}
	}
	require.Equal(t, cfg.Model.NLayer, n)
	without, err := tr.Evaluate()
	require.NoError(t, err)
	require.Equal(t, without, with)
}

// TestLoRALlamaAgainstPyTorch: adapters on a Llama's q and v (inside its
// fused q|k|v), o and down projections, held to the PyTorch Llama with
// PEFT-style adapters in float64: every step's loss and gradient norm, the
// last step's adapter gradients and the final adapters to 1e-9; the base
// unchanged.
func TestLoRALlamaAgainstPyTorch(t *testing.T) {
	if !torchAvailable() {
		t.Skip("/usr/bin/python3 has no torch")
	}
	cfg := llamaRefConfig("float64", false)
	cfg.LoRA.Rank, cfg.LoRA.Alpha, cfg.LoRA.Targets = 4, 8, []string{"q_proj", "v_proj", "o_proj", "down_proj"}
	grab := &stepGrabber{step: refSteps - 1}
	tr, err := New(cfg, Options{Train: data.Encode(refText), Plugins: []Plugin{grab}})
	require.NoError(t, err)
	ts := map[string]*tensor.Tensor{}
	start := map[string][]float64{}
	for _, p := range tr.Model.Params() {
		ts[p.Name] = p.Clone(tensor.Params)
		start[p.Name] = p.Float64s()
	}
	ts["batch.x"], ts["batch.y"] = refBatches(tr, cfg)
	meta := llamaRefMeta(cfg)
	meta["tie_embeddings"] = "false"
	meta["lora_rank"], meta["lora_alpha"], meta["lora_targets"] = "4", "8", "q_proj,v_proj,o_proj,down_proj"
	meta["grad_step"] = strconv.Itoa(refSteps - 1)
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.safetensors"), filepath.Join(dir, "out.safetensors")
	require.NoError(t, ckpt.Save(in, ts, meta))
	runScript(t, "../../tools/torchref/llama_ref.py", in, out)
	ref, _, err := ckpt.Load(out)
	require.NoError(t, err)
	for s := 0; s < refSteps; s++ {
		sm, err := tr.Step(s)
		require.NoError(t, err)
		require.InEpsilon(t, ref["loss"].At(s), sm.Loss, 1e-9, "loss of step %d", s)
		require.InEpsilon(t, ref["grad_norm"].At(s), sm.GradNorm, 1e-9, "grad norm of step %d", s)
	}
	adapters := 0
	for _, p := range tr.Model.Params() {
		if !p.NeedsGrad() {
			require.Nil(t, ref["grad."+p.Name], p.Name)
			require.Equal(t, start[p.Name], p.Float64s(), "frozen %s is bitwise unchanged", p.Name)
			continue
		}
		adapters++
		require.LessOrEqual(t, normRel(grab.grads[p.Name], ref["grad."+p.Name].Float64s()), 1e-9, "last-step gradient of %s", p.Name)
		require.LessOrEqual(t, normRel(p.Float64s(), ref["param."+p.Name].Float64s()), 1e-9, "final %s", p.Name)
	}
	require.Equal(t, 2*4*cfg.Model.NLayer, adapters)
}

// The config's list of modules a target may name is the model's list of
// linear weights adapters can sit beside, for each architecture, and a
// target matches the same modules in both.
func TestLoRAModulesAgree(t *testing.T) {
	for _, arch := range []string{"gpt2", "llama"} {
		cfg := config.Defaults()
		cfg.Model.Arch = arch
		cfg.LoRA.Rank = 2
		var names []string
		for _, tg := range GPTConfig(cfg).LoRATargets() {
			names = append(names, tg.Module)
		}
		require.Equal(t, config.LoRAModules(arch), names, arch)
		for _, target := range []string{"c_attn", "c_proj", "attn.c_proj", "q_proj", "proj", "mlp"} {
			cfg.LoRA.Targets = []string{target}
			var want []string
			for _, m := range names {
				if config.LoRATargeted(m, cfg.LoRA.Targets) {
					want = append(want, m)
				}
			}
			var got []string
			for _, tg := range GPTConfig(cfg).Adapted() {
				got = append(got, tg.Module)
			}
			require.Equal(t, want, got, "%s target %s", arch, target)
		}
	}
}
