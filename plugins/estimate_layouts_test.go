package plugins

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// modelLayouts are the layouts that rewrite the model or own the step:
// tensor parallel (with and without sequence parallel, alone and under
// dp 2, ZeRO-1 and ZeRO-3) and pipeline parallel under each schedule
// (2 and 4 stages, an uneven split, and under dp 2).
var modelLayouts = []struct {
	name  string
	world int
	set   func(c *config.Config)
}{
	{"tp 2", 2, func(c *config.Config) { c.Parallel.TP = 2 }},
	{"tp 2 + sp", 2, func(c *config.Config) { c.Parallel.TP = 2; c.TP.SequenceParallel = true }},
	{"tp 2 grad_accum 2", 2, func(c *config.Config) { c.Parallel.TP = 2; c.Train.GradAccum = 2 }},
	{"tp 2 vocab 257", 2, func(c *config.Config) { c.Parallel.TP = 2; c.Model.VocabSize = 257 }},
	{"tp 4", 4, func(c *config.Config) { c.Parallel.TP = 4 }},
	{"tp 2 × dp 2 ddp", 4, func(c *config.Config) { c.Parallel.TP = 2 }},
	{"tp 2 × dp 2 zero-1", 4, func(c *config.Config) { c.Parallel.TP = 2; c.Zero.Stage = 1 }},
	{"tp 2 × dp 2 zero-3", 4, func(c *config.Config) { c.Parallel.TP = 2; c.Zero.Stage = 3 }},
	{"pp 2 afab", 2, func(c *config.Config) { c.Parallel.PP = 2; c.PP.Schedule = "afab" }},
	{"pp 2 1f1b", 2, func(c *config.Config) { c.Parallel.PP = 2; c.PP.Schedule = "1f1b" }},
	{"pp 2 interleaved", 2, func(c *config.Config) { c.Parallel.PP = 2; c.PP.Schedule = "interleaved"; c.PP.VirtualStages = 2 }},
	{"pp 2 zb1", 2, func(c *config.Config) { c.Parallel.PP = 2; c.PP.Schedule = "zb1" }},
	{"pp 2 1f1b × dp 2", 4, func(c *config.Config) { c.Parallel.PP = 2; c.PP.Schedule = "1f1b" }},
	{"pp 2 1f1b × dp 2 zero-1", 4, func(c *config.Config) { c.Parallel.PP = 2; c.PP.Schedule = "1f1b"; c.Zero.Stage = 1 }},
	{"tp 2 × pp 2 1f1b", 4, func(c *config.Config) { c.Parallel.TP = 2; c.Parallel.PP = 2; c.PP.Schedule = "1f1b" }},
	{"pp 4 1f1b", 4, func(c *config.Config) { c.Parallel.PP = 4; c.PP.Schedule = "1f1b" }},
	{"pp 4 zb1", 4, func(c *config.Config) { c.Parallel.PP = 4; c.PP.Schedule = "zb1" }},
	{"pp 2 1f1b layers 3,1", 2, func(c *config.Config) { c.Parallel.PP = 2; c.PP.Schedule = "1f1b"; c.PP.Layers = "3,1" }},
}

// TestEstimateMatchesMeasuredModelLayouts is TestEstimateMatchesMeasured
// for tensor and pipeline parallel: params, gradients and optimizer state
// exact, activations and the simultaneous peak within 15%, on every rank
// (pipeline stages differ: the first holds the embedding, the last the
// head and the loss). Pipelines run 4 micro-batches a step.
func TestEstimateMatchesMeasuredModelLayouts(t *testing.T) {
	for _, shape := range [][4]int{{4, 64, 32, 4}, {4, 32, 16, 2}} {
		for _, l := range modelLayouts {
			t.Run(fmt.Sprintf("L%d C%d T%d/%s", shape[0], shape[1], shape[2], l.name), func(t *testing.T) {
				cfg := ptest.Config()
				cfg.Model.NLayer, cfg.Model.NEmbd, cfg.Model.BlockSize, cfg.Model.NHead = shape[0], shape[1], shape[2], shape[3]
				cfg.Train.Steps = 2
				l.set(&cfg)
				est, got := estimateAndMeasure(t, cfg, l.world)
				require.Len(t, est, l.world)
				for r, m := range got {
					e := est[r]
					t.Logf("%s rank %d: params %d est %d | grads %d est %d | optim %d est %d | activations %d est %d (%+.1f%%) | peak %d est %d (%+.1f%%)",
						t.Name()[len("TestEstimateMatchesMeasuredModelLayouts/"):], r, m.ParamsBytes, e.ParamsBytes, m.GradsBytes, e.GradsBytes, m.OptimBytes, e.OptimBytes,
						m.ActPeak, e.ActPeak, pct(e.ActPeak, m.ActPeak), m.PeakBytes, e.PeakBytes, pct(e.PeakBytes, m.PeakBytes))
				}
				for r, m := range got {
					e := est[r]
					require.Equal(t, r, e.Rank)
					require.Equal(t, m.ParamsBytes, e.ParamsBytes, "rank %d params", r)
					require.Equal(t, m.GradsBytes, e.GradsBytes, "rank %d grads", r)
					require.Equal(t, m.OptimBytes, e.OptimBytes, "rank %d optimizer state", r)
					within := func(what string, got, want int64) {
						require.LessOrEqual(t, math.Abs(float64(want-got)), 0.15*float64(got),
							"rank %d %s: estimated %d, measured %d", r, what, want, got)
					}
					within("activations", m.ActPeak, e.ActPeak)
					within("peak", m.PeakBytes, e.PeakBytes)
				}
			})
		}
	}
}

// TestEstimateMatchesMeasuredMixedPrecision is TestEstimateMatchesMeasured
// under train.mixed_precision: the parameters' column is the 2-byte
// copies the products read, exact, and the float32 masters are counted,
// exactly, in the optimizer state's column with the moments, for one
// process, data parallel (ZeRO-1 and -2 too), context, tensor and
// pipeline parallel, and the recomputation granularities. The
// activations, kept for the backward in 2 bytes, are held within 10%
// (measured: -3.8% to +2.0%), at a shape where the output stage holds
// the peak and at one where the last block's MLP does.
func TestEstimateMatchesMeasuredMixedPrecision(t *testing.T) {
	layouts := []struct {
		name  string
		world int
		set   func(c *config.Config)
	}{
		{"one process", 1, func(c *config.Config) {}},
		{"ddp dp 2", 2, func(c *config.Config) {}},
		{"zero-1 dp 2", 2, func(c *config.Config) { c.Zero.Stage = 1 }},
		{"zero-2 dp 2 grad_accum 2", 2, func(c *config.Config) { c.Zero.Stage = 2; c.Train.GradAccum = 2 }},
		{"zero-3 dp 2", 2, func(c *config.Config) { c.Zero.Stage = 3 }},
		{"zero-3 dp 2 grad_accum 2", 2, func(c *config.Config) { c.Zero.Stage = 3; c.Train.GradAccum = 2 }},
		{"cp 2", 2, func(c *config.Config) { c.Parallel.CP = 2 }},
		{"tp 2", 2, func(c *config.Config) { c.Parallel.TP = 2 }},
		{"tp 2 × dp 2 zero-1", 4, func(c *config.Config) { c.Parallel.TP = 2; c.Zero.Stage = 1 }},
		{"tp 2 + sp", 2, func(c *config.Config) { c.Parallel.TP = 2; c.TP.SequenceParallel = true }},
		{"pp 2 1f1b", 2, func(c *config.Config) { c.Parallel.PP = 2; c.PP.Schedule = "1f1b"; c.Train.GradAccum = 4 }},
		{"pp 2 zb1", 2, func(c *config.Config) { c.Parallel.PP = 2; c.PP.Schedule = "zb1"; c.Train.GradAccum = 4 }},
		{"selective", 1, func(c *config.Config) { c.Recompute.Granularity = "selective" }},
		{"full", 1, func(c *config.Config) { c.Recompute.Granularity = "full" }},
		// 256 wide, the vocabulary 256: the last block's MLP holds the
		// peak (at GELU's backward), not the output stage.
		{"one process wide", 1, func(c *config.Config) { c.Model.NEmbd, c.Model.NHead = 256, 4 }},
		{"selective wide", 1, func(c *config.Config) {
			c.Model.NEmbd, c.Model.NHead, c.Recompute.Granularity = 256, 4, "selective"
		}},
		{"full wide", 1, func(c *config.Config) { c.Model.NEmbd, c.Model.NHead, c.Recompute.Granularity = 256, 4, "full" }},
	}
	for _, mp := range []string{"bf16", "fp16"} {
		for _, l := range layouts {
			t.Run(mp+"/"+l.name, func(t *testing.T) {
				cfg := ptest.Config()
				cfg.Model.NLayer, cfg.Model.NEmbd, cfg.Model.BlockSize, cfg.Model.NHead = 2, 33, 16, 3
				cfg.Train.Steps, cfg.Train.MixedPrecision = 2, mp
				l.set(&cfg)
				if cfg.Parallel.TP > 1 && cfg.Model.NEmbd == 33 {
					cfg.Model.NEmbd, cfg.Model.NHead = 32, 2
				}
				est, err := Estimate(cfg, l.world)
				require.NoError(t, err)
				got := measure(t, cfg, l.world)
				for r, m := range got {
					e := est[r]
					require.Equal(t, m.ParamsBytes, e.ParamsBytes, "rank %d params (half copies)", r)
					require.Equal(t, m.GradsBytes, e.GradsBytes, "rank %d grads", r)
					require.Equal(t, m.OptimBytes, e.OptimBytes, "rank %d optimizer state and masters", r)
					t.Logf("rank %d: params %d grads %d optim %d | activations %d est %d (%+.1f%%) | peak %d est %d (%+.1f%%)", r, m.ParamsBytes, m.GradsBytes, m.OptimBytes,
						m.ActPeak, e.ActPeak, pct(e.ActPeak, m.ActPeak), m.PeakBytes, e.PeakBytes, pct(e.PeakBytes, m.PeakBytes))
					require.LessOrEqual(t, math.Abs(float64(e.ActPeak-m.ActPeak)), 0.10*float64(m.ActPeak),
						"rank %d activations: estimated %d, measured %d", r, e.ActPeak, m.ActPeak)
					require.LessOrEqual(t, math.Abs(float64(e.PeakBytes-m.PeakBytes)), 0.15*float64(m.PeakBytes),
						"rank %d peak: estimated %d, measured %d", r, e.PeakBytes, m.PeakBytes)
				}
			})
		}
	}
}
