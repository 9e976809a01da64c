package plugins

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// mpLayout is one row of the mixed-precision matrix: n ranks, dp of them
// data-parallel, and the keys that make the layout.
type mpLayout struct {
	name  string
	n, dp int
	apply func(c *config.Config)
	b     ptest.Bounds
}

// zeroMixed is the bound of a ZeRO row under mixed precision against one
// process: a ZeRO rank knows the other ranks' parameters only through
// their 2-byte copies, so every op (embeddings, norms, biases) reads the
// masters rounded, where one process rounds only the products' operands
// (docs/mixed-precision.md). Measured over 4 steps, bf16: losses 7.7e-5,
// gradient norms 1.4e-3, weights 1.1e-2.
var zeroMixed = ptest.Bounds{Loss: 3e-3, Weights: 3e-2}

// TestEquivalenceMixedPrecision runs the layouts of the matrix in bf16 and
// fp16 against one process in the same precision on the same global batch.
//
// Data parallel runs each product on the same kind of operands as one
// process and reduces float32 gradients, so in bf16 it keeps the float32
// bounds (losses and gradient norms 1e-5, weights 1e-4, the attention key
// bias 1e-3 as in TestEquivalenceProcesses). In fp16 the float32 noise of
// the gradient sums (~1e-7) moves some master weights across one of
// fp16's finer rounding boundaries, so the weight copies the next step
// reads differ by an fp16 ulp in a few elements: measured 1.5e-4 on the
// weights after 4 steps; fp16 rows are held to 1e-3 on weights (losses
// and norms stay at 1e-5).
//
// ZeRO (stages 1, 2 and 3 alike, bitwise) keeps only its shard of the
// float32 masters: a rank knows the others' parameters through their
// 2-byte copies only, so every operation reads the rounded masters (the
// embedding lookups, LayerNorm and the biases too, not only the products
// as one process does; zero/mixed.go). Measured over 4 steps, bf16:
// losses 7.7e-5, gradient norms 1.4e-3, weights 1.1e-2 (h.0.ln_2.bias);
// fp16: losses 9.3e-6, norms 2.7e-4, weights 9.4e-4. They are held to
// 3e-3 on losses and gradient norms and 3e-2 on weights, and the three
// stages to one another bitwise.
//
// Pipeline, tensor parallel (with and without sequence parallel) and
// context parallel (ring and all-gather) carry activations and activation
// gradients in the compute dtype (bf16/fp16, half the bytes; comm.SendAs
// and its kin, cp's ringWire), where one process keeps them in float32:
// each crossing rounds them to 8 (bf16) or 11 (fp16) significant bits, and
// AdamW carries that into every update. Measured over 4 steps, bf16:
// losses up to 1.2e-5, gradient norms 2.6e-4, weights 1.2e-2 norm-wise
// (tp 2, h.1.attn.c_proj); fp16: losses 7.3e-6, norms 1.0e-4, weights
// 5.5e-3 (pp 2). They are held to 1e-3 on losses and gradient norms and
// 3e-2 on weights. The attention's key bias under context parallel is the
// exception: its gradient is zero in theory (softmax ignores a shift of
// every score of a row), it starts at zero, and its value after 4 steps is
// AdamW's full-size answer to rounding noise in the exchanged keys'
// gradients, so norm-wise it differs by up to 0.42 (bf16 all-gather; ring
// 0.37, fp16 0.12); it is held to 0.6, the other tensors of those rows to
// 3e-2.
func TestEquivalenceMixedPrecision(t *testing.T) {
	f32 := ptest.Float32Bounds
	f32.Wider = map[string]float64{".attn.c_attn.bias": 1e-3}
	wire := ptest.Bounds{Loss: 1e-3, Weights: 3e-2}
	zero := zeroMixed
	cpWire := wire
	cpWire.Wider = map[string]float64{".attn.c_attn.bias": 0.6}
	layouts := []mpLayout{
		{"ddp bucketed", 2, 2, func(c *config.Config) { c.DDP.BucketMB, c.DDP.FirstBucketMB = 0.02, 0.01 }, f32},
		{"zero 1", 2, 2, func(c *config.Config) { c.Zero.Stage = 1 }, zero},
		{"zero 2", 2, 2, func(c *config.Config) { c.Zero.Stage = 2 }, zero},
		{"zero 3", 2, 2, func(c *config.Config) { c.Zero.Stage = 3 }, zero},
		{"pp 2 1f1b", 2, 1, func(c *config.Config) { c.Parallel.PP = 2; c.Train.GradAccum = 2 }, wire},
		{"cp 2 ring", 2, 1, func(c *config.Config) { c.Parallel.CP = 2 }, cpWire},
		{"cp 2 allgather", 2, 1, func(c *config.Config) { c.Parallel.CP = 2; c.CP.Attention = "allgather" }, cpWire},
		{"tp 2", 2, 1, func(c *config.Config) { c.Parallel.TP = 2 }, wire},
		{"tp 2 sp", 2, 1, func(c *config.Config) { c.Parallel.TP = 2; c.TP.SequenceParallel = true }, wire},
	}
	for _, mp := range []string{"bf16", "fp16"} {
		var zeroRun *ptest.Result // the first ZeRO row's rank 0
		for _, l := range layouts {
			if mp == "fp16" && l.b.Weights < 1e-3 {
				l.b = ptest.Bounds{Loss: l.b.Loss, Weights: 1e-3}
			}
			single := ptest.Config()
			single.Train.Steps, single.Train.MixedPrecision = 4, mp
			l.apply(&single)
			single.Parallel.TP, single.Parallel.PP, single.Parallel.CP, single.Zero.Stage = 1, 1, 1, 0
			single.TP.SequenceParallel = false
			want := ptest.Single(t, single)
			cfg := ptest.Config()
			cfg.Train.Steps, cfg.Train.MixedPrecision = 4, mp
			l.apply(&cfg)
			cfg.Train.BatchSize = single.Train.BatchSize / l.dp
			got := ptest.Parallel(t, cfg, l.n, "local", func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) { return Build(cfg, g) })
			ptest.CheckWithin(t, want, got, fmt.Sprintf("%s %s", mp, l.name), l.b)
			if strings.HasPrefix(l.name, "zero") {
				// Every stage reads the same 2-byte copies of the same
				// masters: stage 1 and 2's refreshed whole copy, stage 3's
				// gathered units.
				if zeroRun == nil {
					zeroRun = &got[0]
				}
				require.Equal(t, zeroRun.Losses, got[0].Losses, "%s %s: the ZeRO stages agree bitwise", mp, l.name)
				require.Equal(t, zeroRun.Params, got[0].Params, "%s %s: the ZeRO stages agree bitwise", mp, l.name)
			}
		}
	}
}

// TestEquivalenceReduceDType runs data parallel under bf16 with gradients
// reduced in float32 (ddp.reduce_dtype=fp32, the default) and in bf16,
// against one process in bf16 on the same global batch. fp32 reduction
// keeps the float32 bounds on the masters. bf16 reduction rounds each
// rank's gradients and their average to bf16 (8 significant bits, a
// relative error up to 2^-9 per element), which AdamW carries into the
// update; one process rounds nothing. Measured over 4 steps (bucketed and
// naive alike, the same bits): losses 2.0e-6, gradient norms 5.0e-4,
// weights 5.8e-3 (h.0.attn.c_proj.weight), and 2.7e-2 on the attention's
// key bias, whose gradient is zero in theory, so AdamW turns its rounding
// noise into full steps (1e-3 at float32 already). bf16 rows are held to
// 1e-3 on losses and gradient norms, 1e-2 on weights, 5e-2 on the key bias.
// ZeRO's rows also read the rounded masters in every operation
// (TestEquivalenceMixedPrecision): measured losses 7.5e-5, norms 1.5e-3,
// the key bias 2.6e-2, held to ZeRO's bounds there (3e-3, 3e-2) and 5e-2
// on the key bias.
func TestEquivalenceReduceDType(t *testing.T) {
	f32 := ptest.Float32Bounds
	f32.Wider = map[string]float64{".attn.c_attn.bias": 1e-3}
	bf16 := ptest.Bounds{Loss: 1e-3, Weights: 1e-2, Wider: map[string]float64{".attn.c_attn.bias": 5e-2}}
	zero := zeroMixed
	zero.Wider = bf16.Wider
	for _, l := range []struct {
		name, reduce, mode string
		b                  ptest.Bounds
	}{
		{"fp32 bucketed", "fp32", "bucketed", f32},
		{"bf16 bucketed", "bf16", "bucketed", bf16},
		{"bf16 naive", "bf16", "naive", bf16},
		{"bf16 zero 1", "bf16", "zero1", zero},
		{"bf16 zero 3", "bf16", "zero3", zero},
	} {
		single := ptest.Config()
		single.Train.Steps, single.Train.MixedPrecision = 4, "bf16"
		want := ptest.Single(t, single)
		cfg := single
		cfg.DDP.ReduceDType, cfg.DDP.Mode = l.reduce, l.mode
		if stage, ok := strings.CutPrefix(l.mode, "zero"); ok {
			cfg.DDP.Mode, cfg.Zero.Stage = "bucketed", int(stage[0]-'0')
		}
		cfg.DDP.BucketMB, cfg.DDP.FirstBucketMB = 0.02, 0.01
		cfg.Train.BatchSize = single.Train.BatchSize / 2
		got := ptest.Parallel(t, cfg, 2, "local", func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) { return Build(cfg, g) })
		ptest.CheckWithin(t, want, got, "dp 2 reduce "+l.name, l.b)
	}
}

// TestMixedPrecisionZeroResume: a ZeRO checkpoint under mixed precision
// holds the float32 masters (the shards of every rank, as float32
// tensors); resuming it under the layout that saved continues bitwise,
// and it resumes under one process, whose checkpoint ZeRO resumes in turn,
// within ZeRO's bounds of TestEquivalenceMixedPrecision against one
// process's uninterrupted run.
func TestMixedPrecisionZeroResume(t *testing.T) {
	zero := zeroMixed
	for _, mp := range []string{"bf16", "fp16"} {
		single := layouts[0]
		run := func(l layout, steps int, resume string) (ptest.Result, string) {
			cfg := l.config(steps)
			cfg.Train.MixedPrecision = mp
			cfg.Checkpoint.Dir, cfg.Resume = filepath.Join(t.TempDir(), "ckpt"), resume
			return l.run(t, cfg, "local"), filepath.Join(cfg.Checkpoint.Dir, ckpt.StepDir(steps))
		}
		whole, _ := run(single, resumeSteps, "")
		want := whole
		want.Losses, want.GradNorms = whole.Losses[resumeSave:], whole.GradNorms[resumeSave:]
		_, singleDir := run(single, resumeSave, "")
		for _, l := range layouts[3:6] { // zero1, zero2, zero3 at dp 2
			what := fmt.Sprintf("%s %s", mp, l.name)
			_, dir := run(l, resumeSave, "")
			ix, err := ckpt.ReadIndex(dir)
			require.NoError(t, err)
			for name, ti := range ix.Tensors {
				require.Equal(t, "float32", ti.DType, "%s: %s is kept as a float32 master", what, name)
			}
			uninterrupted, _ := run(l, resumeSteps, "")
			same, _ := run(l, resumeSteps, dir)
			require.Equal(t, uninterrupted.Losses[resumeSave:], same.Losses, "%s resumed by itself", what)
			require.Equal(t, uninterrupted.Params, same.Params, "%s resumed by itself", what)
			onOne, _ := run(single, resumeSteps, dir)
			ptest.AssertWithin(t, want, onOne, what+" checkpoint resumed by one process", zero)
			fromOne, _ := run(l, resumeSteps, singleDir)
			ptest.AssertWithin(t, want, fromOne, "one process's checkpoint resumed by "+what, zero)
		}
	}
}

// A MoE GPT under bf16 (its experts' rows, hidden layers and outputs, the
// exchanged rows and the router's logits stored in 2 bytes with the rest
// of the block; the router's probabilities and renormalised weights kept
// float32, tensor.SoftmaxRows) trains under data parallel and expert
// parallel (ep 2 over dp 2, the tokens exchanged in float32) as one
// process does, at the float32 bounds of the data-parallel rows of
// TestEquivalenceMixedPrecision. Stored in 2 bytes, those two outputs made
// dp 2 differ from one process by 3.2e-5 on the gradient norm of step 3.
//
// The ZeRO-1 rows read every parameter through its rounded 2-byte copy
// (zeroMixed), which moves the router's logits, so a token whose second
// and third experts are near-tied can go to another expert than on one
// process: a discrete change. Measured at seeds 1 to 5 with the MoE
// buffers in float32 (before they were stored): losses up to 5.1e-4,
// gradient norms 4.6e-2, weights 1.7e-1 (biases, which start at zero);
// stored: 2.3e-4, 2.2e-2, 1.3e-1. At this seed stored: losses 1.2e-4,
// norms 1.3e-3, weights 5.0e-2 (h.0.mlp.experts.1.c_fc.bias; 2.7e-2
// float32). They are held to zeroMixed's 3e-3 on losses and norms and
// 1e-1 on weights.
func TestMoEMixedPrecision(t *testing.T) {
	b := ptest.Float32Bounds
	b.Wider = map[string]float64{".attn.c_attn.bias": 1e-3}
	zeroMoE := ptest.Bounds{Loss: zeroMixed.Loss, Weights: 1e-1}
	single := ptest.Config()
	single.Train.Steps, single.Train.MixedPrecision = 4, "bf16"
	single.Model.MoE.Experts, single.Model.MoE.TopK = 4, 2
	single.Model.MoE.AuxLossCoef, single.Model.MoE.ZLossCoef = 0.5, 0.05
	want := ptest.Single(t, single)
	for _, row := range []struct{ ep, zero int }{{1, 0}, {1, 1}, {2, 0}, {2, 1}} {
		cfg := single
		cfg.Parallel.EP, cfg.Zero.Stage = row.ep, row.zero
		cfg.Train.BatchSize = single.Train.BatchSize / 2
		require.NoError(t, cfg.CheckWorld(2))
		got := ptest.Parallel(t, cfg, 2, "local", func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) { return Build(cfg, g) })
		bounds := b
		if row.zero > 0 {
			bounds = zeroMoE
		}
		ptest.CheckWithin(t, want, got, fmt.Sprintf("moe bf16 dp 2 ep %d zero %d", row.ep, row.zero), bounds)
	}

	// ep 2 × tp 2 (dp 2): tensor parallel's activations cross in bf16
	// (the wire rows of TestEquivalenceMixedPrecision), which move the
	// router's logits too, so with top-2 a near-tied token can change
	// experts: measured with the MoE buffers in 2 bytes, losses 1.7e-4 and
	// gradient norms 7.1e-3 (in float32, 1.2e-5 and 3.0e-4 at this seed).
	// With every token to every expert nothing is chosen, and the row is
	// held to the wire rows' 1e-3 on losses and norms (measured 3.6e-5,
	// 3.2e-4) and 6e-2 on weights, above the wire rows' 3e-2: measured
	// 4.6e-2 norm-wise on h.1.attn.c_attn.bias (whose key part's gradient
	// is zero in theory), and 4.5e-2 with the buffers in float32, on an
	// expert's c_fc bias (which starts at zero).
	all := single
	all.Model.MoE.TopK = 4
	want = ptest.Single(t, all)
	cfg := all
	cfg.Parallel.EP, cfg.Parallel.TP = 2, 2
	cfg.Train.BatchSize = all.Train.BatchSize / 2
	require.NoError(t, cfg.CheckWorld(4))
	got := ptest.Parallel(t, cfg, 4, "local", func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) { return Build(cfg, g) })
	ptest.CheckWithin(t, want, got, "moe bf16 top 4 ep 2 tp 2", ptest.Bounds{Loss: 1e-3, Weights: 6e-2})
}
