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

// keyBias bounds, norm-wise, the attention's key bias (the k third of
// .attn.c_attn.bias) of every mixed-precision row against one process.
// Its gradient is zero in theory (softmax ignores a shift of every score
// of a row) and it starts at zero. Under mixed precision the attention's
// backward products read dS = P∘(dP - delta) rounded to bf16/fp16 (dk =
// dS^T q, as PyTorch's autocast does), so the rows of dS no longer sum to
// zero and the key bias's gradient is that rounding noise, which AdamW
// turns into steps of about lr each. Two runs that differ anywhere by a
// half-precision rounding (a crossing in the compute dtype, or one
// master copy that float32 noise moved across a rounding tie) get
// unrelated noise there, and their key biases part by a sizeable fraction
// of their norm: measured after 4 steps up to 1.6e-2 (bf16) and 7.1e-2
// (fp16) for data parallel, 0.26 with gradients reduced in bf16, 0.46 to
// 0.56 for pipeline, tensor and context parallel, where every other
// tensor stays within 1.4e-2. Held to 1.
var keyBias = map[string]float64{".attn.c_attn.bias": 1}

// dpMixed is the bound of a data-parallel row (DDP or any ZeRO stage,
// gradients reduced in float32) under mixed precision against one
// process: 1e-4 on losses and gradient norms (ten times float32's) and
// 1e-3 on weights, the key bias at keyBias (TestEquivalenceMixedPrecision
// says why).
var dpMixed = ptest.Bounds{Loss: 1e-4, Weights: 1e-3, Wider: keyBias}

// TestEquivalenceMixedPrecision runs the layouts of the matrix in bf16 and
// fp16 against one process in the same precision on the same global batch.
//
// Every layout reads the same parameter values in every op: the 2-byte
// copies of the masters (tensor/precision.go), which is all a ZeRO rank
// knows of the other ranks' parameters. Data parallel, DDP and ZeRO
// (stages 1, 2 and 3 alike, bitwise) runs each op on the same kind of
// operands as one process and reduces float32 gradients. Their float32
// noise (~1e-7) moves some masters across a rounding tie of their half
// copy now and then, and from there the runs differ at half precision's
// noise, not float32's; the attention's key bias then takes unrelated
// rounding noise for its gradient (keyBias). Measured over 4 steps, DDP
// and ZeRO alike: bf16 losses 9.3e-7, gradient norms 1.0e-5, weights
// 6.7e-5 (h.0.ln_1.bias) and the key bias 1.6e-2; fp16 losses 3.0e-6,
// norms 3.0e-6, weights 1.1e-4 (h.0.ln_2.bias), key bias 7.1e-2. (With
// only the attention's scores in bf16 and its other products float32, the
// key bias's gradient was float32 noise and no copy moved at this seed:
// bf16 4.6e-8, 1.2e-8, 4.3e-8.) Held to dpMixed: 1e-4 on losses and
// gradient norms, 1e-3 on weights.
//
// Pipeline, tensor parallel (with and without sequence parallel) and
// context parallel (ring and all-gather) carry activations and activation
// gradients in the compute dtype (bf16/fp16, half the bytes; comm.SendAs
// and its kin, cp's ringWire), where one process keeps them in float32:
// each crossing rounds them to 8 (bf16) or 11 (fp16) significant bits, and
// AdamW carries that into every update. Measured over 4 steps, bf16:
// losses up to 3.0e-5 (tp 2), gradient norms 6.8e-4 (pp 2), weights
// 1.4e-2 norm-wise (pp 2 and tp 2, h.1.attn.c_proj.weight); fp16: losses
// 3.2e-6, norms 1.6e-4, weights 4.1e-3 (pp 2). They are held to 1e-3 on
// losses and gradient norms and 3e-2 on weights, the key bias to keyBias
// (measured 0.46 to 0.56 in bf16, 0.16 to 0.24 in fp16).
func TestEquivalenceMixedPrecision(t *testing.T) {
	dp := dpMixed
	wire := ptest.Bounds{Loss: 1e-3, Weights: 3e-2, Wider: keyBias}
	layouts := []mpLayout{
		{"ddp bucketed", 2, 2, func(c *config.Config) { c.DDP.BucketMB, c.DDP.FirstBucketMB = 0.02, 0.01 }, dp},
		{"zero 1", 2, 2, func(c *config.Config) { c.Zero.Stage = 1 }, dp},
		{"zero 2", 2, 2, func(c *config.Config) { c.Zero.Stage = 2 }, dp},
		{"zero 3", 2, 2, func(c *config.Config) { c.Zero.Stage = 3 }, dp},
		{"pp 2 1f1b", 2, 1, func(c *config.Config) { c.Parallel.PP = 2; c.Train.GradAccum = 2 }, wire},
		{"cp 2 ring", 2, 1, func(c *config.Config) { c.Parallel.CP = 2 }, wire},
		{"cp 2 allgather", 2, 1, func(c *config.Config) { c.Parallel.CP = 2; c.CP.Attention = "allgather" }, wire},
		{"tp 2", 2, 1, func(c *config.Config) { c.Parallel.TP = 2 }, wire},
		{"tp 2 sp", 2, 1, func(c *config.Config) { c.Parallel.TP = 2; c.TP.SequenceParallel = true }, wire},
	}
	for _, mp := range []string{"bf16", "fp16"} {
		var zeroRun *ptest.Result // the first ZeRO row's rank 0
		for _, l := range layouts {
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
// is held to the data-parallel rows' bounds (dpMixed). bf16 reduction rounds each
// rank's gradients and their average to bf16 (8 significant bits, a
// relative error up to 2^-9 per element), which AdamW carries into the
// update; one process rounds nothing. Measured over 4 steps (bucketed,
// naive, ZeRO 1 and ZeRO 3 alike, the same bits: ZeRO reads the
// parameters as DDP does and reduces by the same rule): losses 1.2e-5,
// gradient norms 1.7e-4, weights 5.7e-3 (h.1.attn.c_proj.weight), and
// 0.26 on the attention's key bias, whose gradient is zero in theory, so
// AdamW turns its rounding noise into full steps (keyBias). bf16 rows are
// held to 1e-3 on losses and gradient norms, 1e-2 on weights, keyBias on
// the key bias.
func TestEquivalenceReduceDType(t *testing.T) {
	f32 := dpMixed
	bf16 := ptest.Bounds{Loss: 1e-3, Weights: 1e-2, Wider: keyBias}
	for _, l := range []struct {
		name, reduce, mode string
		b                  ptest.Bounds
	}{
		{"fp32 bucketed", "fp32", "bucketed", f32},
		{"bf16 bucketed", "bf16", "bucketed", bf16},
		{"bf16 naive", "bf16", "naive", bf16},
		{"bf16 zero 1", "bf16", "zero1", bf16},
		{"bf16 zero 3", "bf16", "zero3", bf16},
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
// within the data-parallel bounds of TestEquivalenceMixedPrecision
// (dpMixed) against one process's uninterrupted run.
func TestMixedPrecisionZeroResume(t *testing.T) {
	for _, mp := range []string{"bf16", "fp16"} {
		zero := dpMixed
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
// parallel (ep 2 over dp 2), each with and without ZeRO-1, as one process
// does, over 4 steps within 1e-4 on losses and gradient norms (ten times
// float32's) and 1e-3 on weights (the data-parallel rows' dpMixed),
// for a reason no rule can remove. Data parallel sums the gradients in another
// order than one process, so after each step thousands of float32
// masters differ from one process's in their last bit (9248 after the
// first step here), and a master that close to a bf16 rounding tie gets
// a different 2-byte copy, which every op then reads; one differing copy
// moves the bf16 roundings of the products downstream of it, and the
// runs part at bf16's noise rather than float32's. Measured at this
// seed, dp 2: 2 copies differ after step 1, one of them that of
// h.0.mlp.experts.2.c_fc.weight[3172], whose master is one float32 ulp
// below one process's (0.00584411575 against 0.00584411621, bf16 0x3bbf
// against 0x3bc0); one process with that one master set to dp's value
// moves its own gradient norm of step 2 by 7.4e-7 and of step 3 by
// 1.5e-5, where dp differs by 7.5e-7 and 1.4e-5, and dp against that
// one process is back to 8.3e-9 at step 2. 118 copies differ after step
// 2, and the 4 steps end at losses 2.4e-5, gradient norms 3.5e-5,
// weights 3.8e-4 (h.0.ln_1.bias), with and without ZeRO-1. ep 2, whose
// expert gradients are summed in yet another order, has 2 differing
// copies after step 1 as well (one in h.1's experts) and 4 after step
// 4, and ends within 4.6e-8, 5.4e-9 and 8.4e-8: which copy differs
// decides how far the run moves. It is chance, and not MoE's: over
// seeds 1 to 10 every row here stays within 1e-6 on losses and norms,
// while the dense dp 2 row of TestEquivalenceMixedPrecision reaches
// gradient norms of 1.4e-5 and 3.8e-5 at seeds 6 and 9, the second
// after a single differing copy (one element of h.0.mlp.c_fc.weight)
// moved the next step's loss by 3.0e-6. What holds exactly: ZeRO-1
// reads the same copies as data parallel and reduces by the same rule,
// so each ZeRO-1 row's losses and weights equal its data-parallel row's
// bitwise (the gradient norm sums the shards' squares in another order).
func TestMoEMixedPrecision(t *testing.T) {
	single := ptest.Config()
	single.Train.Steps, single.Train.MixedPrecision = 4, "bf16"
	single.Model.MoE.Experts, single.Model.MoE.TopK = 4, 2
	single.Model.MoE.AuxLossCoef, single.Model.MoE.ZLossCoef = 0.5, 0.05
	want := ptest.Single(t, single)
	flips := dpMixed
	for _, ep := range []int{1, 2} {
		var dp []ptest.Result
		for _, zero := range []int{0, 1} {
			what := fmt.Sprintf("moe bf16 dp 2 ep %d zero %d", ep, zero)
			cfg := single
			cfg.Parallel.DP, cfg.Parallel.EP, cfg.Zero.Stage = 2, ep, zero
			cfg.Train.BatchSize = single.Train.BatchSize / 2
			require.NoError(t, cfg.CheckWorld(2))
			got := ptest.Parallel(t, cfg, 2, "local", func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) { return Build(cfg, g) })
			ptest.CheckWithin(t, want, got, what, flips)
			if dp == nil {
				dp = got
				continue
			}
			require.Equal(t, dp[0].Losses, got[0].Losses, "%s: ZeRO-1 equals data parallel bitwise", what)
			require.Equal(t, dp[0].Params, got[0].Params, "%s: ZeRO-1 equals data parallel bitwise", what)
		}
	}

	// ep 2 × tp 2 (dp 2): tensor parallel's activations cross in bf16
	// (the wire rows of TestEquivalenceMixedPrecision), which move the
	// router's logits too, so with top-2 a near-tied token can change
	// experts: measured with the MoE buffers in 2 bytes, losses 1.7e-4 and
	// gradient norms 7.1e-3 (in float32, 1.2e-5 and 3.0e-4 at this seed).
	// With every token to every expert nothing is chosen, and the row is
	// held to the wire rows' 1e-3 on losses and norms (measured 4.5e-5,
	// 3.2e-4) and 6e-2 on weights, above the wire rows' 3e-2: measured
	// 4.5e-2 norm-wise on h.0.mlp.experts.2.c_fc.bias (which starts at
	// zero); the attention's key bias at keyBias (measured 0.53; 4.6e-2
	// while the attention's products other than the scores were float32).
	all := single
	all.Model.MoE.TopK = 4
	want = ptest.Single(t, all)
	cfg := all
	cfg.Parallel.EP, cfg.Parallel.TP = 2, 2
	cfg.Train.BatchSize = all.Train.BatchSize / 2
	require.NoError(t, cfg.CheckWorld(4))
	got := ptest.Parallel(t, cfg, 4, "local", func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) { return Build(cfg, g) })
	ptest.CheckWithin(t, want, got, "moe bf16 top 4 ep 2 tp 2", ptest.Bounds{Loss: 1e-3, Weights: 6e-2, Wider: keyBias})
}
