package plugins

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// The LoRA rows of the matrix: adapters on c_attn (a column-parallel,
// per-head fused layer under tp) and both c_proj (row-parallel) beside a
// frozen float64 GPT-2, trained in each layout like one process on the
// same global batch, to 1e-9; the frozen base ends bitwise as it began.

// loraMatrixConfig is matrixConfig with adapters of rank 4.
func loraMatrixConfig() config.Config {
	c := matrixConfig()
	c.LoRA.Rank, c.LoRA.Alpha, c.LoRA.Targets = 4, 8, []string{"c_attn", "c_proj"}
	return c
}

// loraRow lays base out as s, with more settings, and checks it against
// want, and that every rank's base is unchanged.
func loraRow(t *testing.T, want ptest.Result, base config.Config, s shape4, what string, more func(c *config.Config)) []ptest.Result {
	t.Helper()
	cfg := base
	s.apply(&cfg)
	if more != nil {
		more(&cfg)
	}
	what = "lora " + s.String() + " " + what
	require.NoError(t, cfg.Validate(), what)
	got := ptest.Parallel(t, cfg, s.ranks(), "local", func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) { return Build(cfg, g) })
	ptest.Check(t, want, got, what)
	for name, v := range got[0].Params {
		if !nn.IsAdapter(name) {
			require.Equal(t, want.Initial[name], v, "%s: frozen %s unchanged", what, name)
		}
	}
	return got
}

func TestLoRADataParallel(t *testing.T) {
	base := loraMatrixConfig()
	want := ptest.Single(t, base)
	require.NotEqual(t, want.Initial["h.0.attn.c_attn.lora_B.weight"], want.Params["h.0.attn.c_attn.lora_B.weight"], "the adapters train")
	for _, v := range variants {
		got := loraRow(t, want, base, shape4{2, 1, 1, 1}, v.name, v.apply)
		// Gradients and optimizer state: the adapters' bytes only, all of
		// them per rank under DDP, a shard of them under ZeRO.
		adapters := 8 * trainer.Numel(trainer.TrainedOf(trainer.GPTConfig(base), trainer.GPTConfig(base).ParamShapes()))
		for _, r := range got {
			if strings.HasPrefix(v.name, "ddp") {
				require.Equal(t, adapters, r.Memory.GradsBytes, v.name)
				require.Equal(t, 2*adapters, r.Memory.OptimBytes, v.name)
			} else {
				require.Less(t, r.Memory.OptimBytes, 2*adapters, v.name)
			}
		}
	}
}

// TestLoRAEstimateMatchesMeasured: under LoRA every layout's gradients
// and optimizer state are the adapters' (all of them under DDP, a shard
// of them under ZeRO) and the estimate, made from the config alone,
// equals what the allocators count, to the byte, parameters included
// (ZeRO leaves the frozen base whole on every rank, beside its shards).
func TestLoRAEstimateMatchesMeasured(t *testing.T) {
	for _, biases := range []string{"none", "all"} {
		for _, l := range estimateLayouts {
			if l.cp != "" {
				continue
			}
			t.Run(biases+"/"+l.name, func(t *testing.T) {
				cfg := ptest.Config()
				cfg.Model.NLayer, cfg.Model.NEmbd, cfg.Model.BlockSize, cfg.Model.NHead = 3, 33, 16, 3
				cfg.Train.Steps, cfg.Train.GradAccum, cfg.Zero.Stage = 2, l.accum, l.stage
				cfg.LoRA.Rank, cfg.LoRA.Targets, cfg.LoRA.TrainBiases = 3, []string{"c_attn", "mlp.c_proj"}, biases
				if l.mode != "" {
					cfg.DDP.Mode = l.mode
				}
				m := trainer.GPTConfig(cfg)
				trained := 4 * trainer.Numel(m.TrainedShapes())
				est, err := Estimate(cfg, l.world)
				require.NoError(t, err)
				got := measure(t, cfg, l.world)
				var optim int64
				for r, g := range got {
					e := est[r]
					require.Equal(t, g.ParamsBytes, e.ParamsBytes, "rank %d params", r)
					require.Equal(t, g.GradsBytes, e.GradsBytes, "rank %d grads", r)
					require.Equal(t, g.OptimBytes, e.OptimBytes, "rank %d optimizer state", r)
					if l.stage == 0 {
						require.Equal(t, trained, g.GradsBytes, "rank %d: the trained parameters' gradients", r)
						require.Equal(t, 2*trained, g.OptimBytes, "rank %d: their two moments", r)
					}
					optim += g.OptimBytes
				}
				if l.stage > 0 {
					require.Equal(t, 2*trained, optim, "the ranks' shards hold the trained parameters' moments once")
				}
			})
		}
	}
}

// A pipeline keeps each block's adapters with the block, under every
// schedule (zb1 defers the adapters' weight gradients like any other).
func TestLoRAPipeline(t *testing.T) {
	base := loraMatrixConfig()
	want := ptest.Single(t, base)
	for _, sched := range []string{"afab", "1f1b", "interleaved", "zb1"} {
		sched := sched
		loraRow(t, want, base, shape4{1, 1, 2, 1}, sched, func(c *config.Config) {
			c.PP.Schedule = sched
			if sched == "interleaved" {
				c.PP.VirtualStages = 2
			}
		})
	}
}

// Context parallel needs nothing of its own: the adapters are replicated
// over the cp group and their gradients summed like every weight's.
func TestLoRAContextParallel(t *testing.T) {
	base := loraMatrixConfig()
	want := ptest.Single(t, base)
	loraRow(t, want, base, shape4{1, 1, 1, 2}, "ring zigzag", nil)
}

// Tensor parallel, with and without sequence parallelism: c_attn's B
// split by the q, k and v rows of each rank's heads, A whole (its
// gradient summed over the group); c_proj's A split by input columns, B
// whole (its gradient summed).
func TestLoRATensorParallel(t *testing.T) {
	base := loraMatrixConfig()
	base.LoRA.Targets = []string{"c_attn", "c_proj", "c_fc"}
	want := ptest.Single(t, base)
	for _, sp := range []bool{false, true} {
		sp := sp
		loraRow(t, want, base, shape4{1, 2, 1, 1}, map[bool]string{false: "tp", true: "tp+sp"}[sp], func(c *config.Config) { c.TP.SequenceParallel = sp })
	}
	loraRow(t, want, base, shape4{2, 2, 1, 1}, "ddp", nil)
	loraRow(t, want, base, shape4{2, 2, 1, 1}, "zero3 sp", func(c *config.Config) { c.Zero.Stage, c.TP.SequenceParallel = 3, true })
}

// A Llama's adapters on q, v (inside the fused q|k|v, per kv head group),
// o, up and down under tensor parallel, with sequence parallelism, and
// under data parallel.
func TestLoRALlama(t *testing.T) {
	base := llamaMatrixConfig(false)
	base.LoRA.Rank, base.LoRA.Alpha, base.LoRA.Targets = 4, 8, []string{"q_proj", "v_proj", "o_proj", "up_proj", "down_proj"}
	want := ptest.Single(t, base)
	loraRow(t, want, base, shape4{1, 2, 1, 1}, "llama tp", nil)
	loraRow(t, want, base, shape4{1, 2, 1, 1}, "llama tp+sp", func(c *config.Config) { c.TP.SequenceParallel = true })
	loraRow(t, want, base, shape4{2, 1, 1, 1}, "llama zero2", func(c *config.Config) { c.Zero.Stage = 2 })
	loraRow(t, want, base, shape4{1, 1, 2, 1}, "llama pp 1f1b", nil)
}

// TestLoRAEstimateModelLayouts: under tensor and pipeline parallel too,
// the estimate's parameters, gradients and optimizer state equal what
// the allocators count, to the byte, with the adapters split as their
// base layers (tensor parallel) and kept with their blocks (pipeline).
func TestLoRAEstimateModelLayouts(t *testing.T) {
	for _, l := range modelLayouts {
		t.Run(l.name, func(t *testing.T) {
			cfg := ptest.Config()
			cfg.Model.NLayer, cfg.Model.NEmbd, cfg.Model.BlockSize, cfg.Model.NHead = 4, 32, 16, 2
			cfg.Train.Steps = 2
			cfg.LoRA.Rank, cfg.LoRA.Targets = 4, []string{"c_attn", "c_proj", "c_fc"}
			l.set(&cfg)
			est, got := estimateAndMeasure(t, cfg, l.world)
			for r, m := range got {
				e := est[r]
				require.Equal(t, m.ParamsBytes, e.ParamsBytes, "rank %d params", r)
				require.Equal(t, m.GradsBytes, e.GradsBytes, "rank %d grads", r)
				require.Equal(t, m.OptimBytes, e.OptimBytes, "rank %d optimizer state", r)
			}
		})
	}
}

// saveBase writes the base weights of cfg's model (no adapters) under
// seed to a file, as a short run's save_to would.
func saveBase(t *testing.T, cfg config.Config, seed int64, path string) {
	cfg.LoRA.Rank, cfg.Train.Seed = 0, seed
	m, err := trainer.BuildModel(cfg, nil)
	require.NoError(t, err)
	require.NoError(t, trainer.SaveWeights(m, path))
}

// TestLoRAResumeAcrossLayouts: a LoRA checkpoint holds the adapters and
// their optimizer state and the base's SHA-256, nothing of the base; saved
// by tp 2 × dp 2 it resumes on one process, under ZeRO-3, under a pipeline
// and under tp + sp, each continuing exactly as the uninterrupted single
// process; against another base it is refused before any work.
func TestLoRAResumeAcrossLayouts(t *testing.T) {
	dir := t.TempDir()
	basePath, otherPath := filepath.Join(dir, "base.safetensors"), filepath.Join(dir, "other.safetensors")
	lora := func(c config.Config) config.Config {
		c.LoRA.Rank, c.LoRA.Alpha, c.LoRA.Targets = 4, 8, []string{"c_attn", "c_proj"}
		c.InitFrom = basePath
		return c
	}
	saveBase(t, ptest.Config64(), 7, basePath)
	saveBase(t, ptest.Config64(), 8, otherPath)
	on := func(l layout, steps int) config.Config { return lora(l.on(ptest.Config64(), steps)) }
	saver := layout{"tp2 dp2", 4, func(c *config.Config) { c.Parallel.TP = 2 }}
	full := layouts[0].run(t, on(layouts[0], resumeSteps), "local")
	want := full
	want.Losses, want.GradNorms = full.Losses[resumeSave:], full.GradNorms[resumeSave:]
	ckptDir := filepath.Join(dir, "ckpt")
	cfg := on(saver, resumeSave)
	cfg.Checkpoint.Dir = ckptDir
	saver.run(t, cfg, "local")
	step := filepath.Join(ckptDir, ckpt.StepDir(resumeSave))
	ix, err := ckpt.ReadIndex(step)
	require.NoError(t, err)
	sum := sha256.Sum256(must(os.ReadFile(basePath)))
	require.Equal(t, hex.EncodeToString(sum[:]), ix.LoRABase)
	m := trainer.GPTConfig(cfg)
	require.Len(t, ix.Tensors, len(m.TrainedShapes()))
	for name, ti := range ix.Tensors {
		require.True(t, nn.IsAdapter(name), "the checkpoint holds %s", name)
		require.Contains(t, ti.State, "exp_avg", name)
	}
	for _, resumer := range []layout{layouts[0], layouts[5], layouts[9], layouts[12]} {
		cfg := on(resumer, resumeSteps)
		cfg.Resume = ckptDir
		got := resumer.run(t, cfg, "local")
		what := "lora saved by " + saver.name + ", resumed by " + resumer.name
		t.Logf("%s: %s", what, ptest.AssertEquivalent(t, want, got, what))
	}

	cfg = on(layouts[0], resumeSteps)
	cfg.Resume, cfg.InitFrom = ckptDir, otherPath
	tr, err := trainer.New(cfg, trainer.Options{Train: ptest.Corpus()})
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	other := sha256.Sum256(must(os.ReadFile(otherPath)))
	require.ErrorContains(t, err, fmt.Sprintf("the checkpoint's adapters were trained on the base with SHA-256 %x, but this run's base (init_from=%q) has %x: resume with the base they were trained on", sum, otherPath, other))
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// Dropout on the adapters' input draws one process's mask in every
// layout (each element by its sequence in the global batch, position and
// global column): data parallel, tensor parallel with and without
// sequence parallelism (a row-parallel input's columns at their global
// place), pipelines (zb1 included), full recomputation (the forward run
// again draws the same mask), context parallel (rows at their global
// positions), all to 1e-9.
func TestLoRADropout(t *testing.T) {
	base := loraMatrixConfig()
	base.LoRA.Targets = []string{"c_attn", "c_proj", "c_fc"}
	plain := ptest.Single(t, base)
	base.LoRA.Dropout = 0.2
	want := ptest.Single(t, base)
	require.NotEqual(t, plain.Losses[1], want.Losses[1], "dropout changes the training")
	loraRow(t, want, base, shape4{2, 1, 1, 1}, "dropout ddp", nil)
	loraRow(t, want, base, shape4{2, 1, 1, 1}, "dropout zero2 recompute full", func(c *config.Config) { c.Zero.Stage, c.Recompute.Granularity = 2, "full" })
	loraRow(t, want, base, shape4{1, 2, 1, 1}, "dropout tp", nil)
	loraRow(t, want, base, shape4{1, 2, 1, 1}, "dropout tp+sp", func(c *config.Config) { c.TP.SequenceParallel = true })
	loraRow(t, want, base, shape4{1, 1, 2, 1}, "dropout pp 1f1b", nil)
	loraRow(t, want, base, shape4{1, 1, 2, 1}, "dropout pp zb1", func(c *config.Config) { c.PP.Schedule = "zb1" })
	loraRow(t, want, base, shape4{2, 2, 1, 1}, "dropout zero3 sp", func(c *config.Config) { c.Zero.Stage, c.TP.SequenceParallel = 3, true })
	loraRow(t, want, base, shape4{1, 1, 1, 2}, "dropout cp ring zigzag", nil)
	loraRow(t, want, base, shape4{1, 2, 1, 2}, "dropout cp tp+sp allgather contiguous", func(c *config.Config) {
		c.TP.SequenceParallel, c.CP.Attention, c.CP.Split = true, "allgather", "contiguous"
	})
}

// Tensor parallel with LoRA in float32 matches one process to float32's
// bounds; under bf16 the adapters' products round like the base's, and the
// layouts differ by bf16's noise: a float32 difference in a partial sum
// that moves an operand across a bf16 rounding boundary changes it by 2^-8
// relative (TestEquivalenceMixedPrecision). B starts at zero and after 4
// steps is small (all of it is the update), so its relative difference is
// larger than the base's weights' (the update beside the initial values):
// measured 4.6e-3 on a B, 2.4e-4 on a gradient norm, 6e-6 on a loss. The
// activations also cross the tp ranks in bf16 (each crossing rounds once),
// which lifted a gradient norm to 1.2e-3, an A to 1.8e-2 and the Bs to
// 6.8e-2: AdamW's first steps move each element by about lr·sign(g), so an
// element whose gradient is near zero flips with the rounding, and a B is
// nothing but those steps. Held to 4e-3 (one bf16 step, 2^-8) on losses and gradient
// norms, 3e-2 on weights (TestEquivalenceMixedPrecision's bound for
// activations on the wire) and 0.2 on the Bs.
func TestLoRAMixedPrecision(t *testing.T) {
	for _, mp := range []string{"no", "bf16"} {
		cfg := ptest.Config()
		cfg.Train.Steps, cfg.Train.MixedPrecision = 4, mp
		cfg.LoRA.Rank, cfg.LoRA.Targets = 4, []string{"c_attn", "c_proj"}
		want := ptest.Single(t, cfg)
		b := ptest.Float32Bounds
		if mp == "bf16" {
			b = ptest.Bounds{Loss: 4e-3, Weights: 3e-2, Wider: map[string]float64{".lora_B.weight": 0.2}}
		}
		for _, sp := range []bool{false, true} {
			c := cfg
			c.Parallel.TP, c.TP.SequenceParallel = 2, sp
			got := ptest.Parallel(t, c, 2, "local", func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) { return Build(c, g) })
			what := fmt.Sprintf("lora tp 2 sp=%v mixed_precision=%s", sp, mp)
			t.Logf("%s: %s", what, ptest.CheckWithin(t, want, got, what, b))
		}
		// ZeRO shards the adapters' masters and reads their 2-byte copies,
		// as every layout reads every parameter (TestEquivalenceMixedPrecision's
		// data-parallel rows); the frozen base stays whole, as in one
		// process. These rows keep float32's bounds (measured in bf16:
		// losses 4.3e-8, weights 6.4e-8).
		for _, stage := range []int{2, 3} {
			c := cfg
			c.Zero.Stage, c.Train.BatchSize = stage, cfg.Train.BatchSize/2
			got := ptest.Parallel(t, c, 2, "local", func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) { return Build(c, g) })
			what := fmt.Sprintf("lora zero %d dp 2 mixed_precision=%s", stage, mp)
			t.Logf("%s: %s", what, ptest.CheckWithin(t, want, got, what, ptest.Float32Bounds))
			for name, v := range got[0].Params {
				if !nn.IsAdapter(name) {
					require.Equal(t, want.Initial[name], v, "%s: frozen %s unchanged", what, name)
				}
			}
		}
	}
}
