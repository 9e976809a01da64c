package plugins

import (
	"fmt"
	"testing"

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

// TestEquivalenceMixedPrecision runs the layouts of the matrix in bf16 and
// fp16 against one process in the same precision on the same global batch.
//
// Data parallel, ZeRO and pipeline parallel run each product on the same
// kind of operands as one process and reduce float32 gradients, so in bf16
// they keep the float32 bounds (losses and gradient norms 1e-5, weights
// 1e-4, the attention key bias 1e-3 as in TestEquivalenceProcesses). In
// fp16 the float32 noise of the gradient sums (~1e-7) moves some master
// weights across one of fp16's finer rounding boundaries, so the weight
// copies the next step reads differ by an fp16 ulp in a few elements:
// measured 1.5e-4 on the weights after 4 steps; fp16 rows are held to
// 1e-3 on weights (losses and norms stay at 1e-5). Tensor and
// context parallel sum activations in another order (partial products,
// merged attention blocks), and a float32 difference of ~1e-7 that moves a
// value across a rounding boundary of the half format changes the operand
// the next product reads by a whole half ulp (2^-8 relative in bf16,
// 2^-11 in fp16). That lifts their noise: measured over 4 steps, gradient
// norms up to 4.3e-5 (bf16 tp) and 1.1e-5 (fp16 cp), losses 2e-6, weights
// 3e-4. They are held to 1e-4 on losses and gradient norms and 1e-3 on
// weights.
func TestEquivalenceMixedPrecision(t *testing.T) {
	f32 := ptest.Float32Bounds
	f32.Wider = map[string]float64{".attn.c_attn.bias": 1e-3}
	half := ptest.Bounds{Loss: 1e-4, Weights: 1e-3}
	layouts := []mpLayout{
		{"ddp bucketed", 2, 2, func(c *config.Config) { c.DDP.BucketMB, c.DDP.FirstBucketMB = 0.02, 0.01 }, f32},
		{"zero 1", 2, 2, func(c *config.Config) { c.Zero.Stage = 1 }, f32},
		{"zero 3", 2, 2, func(c *config.Config) { c.Zero.Stage = 3 }, f32},
		{"pp 2 1f1b", 2, 1, func(c *config.Config) { c.Parallel.PP = 2; c.Train.GradAccum = 2 }, f32},
		{"cp 2 ring", 2, 1, func(c *config.Config) { c.Parallel.CP = 2 }, half},
		{"tp 2", 2, 1, func(c *config.Config) { c.Parallel.TP = 2 }, half},
		{"tp 2 sp", 2, 1, func(c *config.Config) { c.Parallel.TP = 2; c.TP.SequenceParallel = true }, half},
	}
	for _, mp := range []string{"bf16", "fp16"} {
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
		}
	}
}
