package plugins

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// peakLayouts are the layouts of the equivalence matrix: DDP, ZeRO-1/2/3,
// tensor parallel with and without sequence parallel, the pipeline
// schedules, context parallel with each attention form, and all four
// dimensions at once.
var peakLayouts = []struct {
	name  string
	world int
	set   func(c *config.Config)
}{
	{"ddp dp 2", 2, func(c *config.Config) {}},
	{"zero-1 dp 2", 2, func(c *config.Config) { c.Zero.Stage = 1 }},
	{"zero-2 dp 2", 2, func(c *config.Config) { c.Zero.Stage = 2 }},
	{"zero-3 dp 2", 2, func(c *config.Config) { c.Zero.Stage = 3 }},
	{"tp 2", 2, func(c *config.Config) { c.Parallel.TP = 2 }},
	{"tp 2 + sp", 2, func(c *config.Config) { c.Parallel.TP = 2; c.TP.SequenceParallel = true }},
	{"pp 2 afab", 2, func(c *config.Config) { c.Parallel.PP, c.PP.Schedule, c.Train.GradAccum = 2, "afab", 2 }},
	{"pp 2 1f1b", 2, func(c *config.Config) { c.Parallel.PP, c.PP.Schedule, c.Train.GradAccum = 2, "1f1b", 2 }},
	{"pp 2 interleaved", 2, func(c *config.Config) {
		c.Parallel.PP, c.PP.Schedule, c.PP.VirtualStages, c.Train.GradAccum = 2, "interleaved", 2, 2
	}},
	{"pp 2 zb1", 2, func(c *config.Config) { c.Parallel.PP, c.PP.Schedule, c.Train.GradAccum = 2, "zb1", 2 }},
	{"cp 2 ring", 2, func(c *config.Config) { c.Parallel.CP = 2 }},
	{"cp 2 allgather", 2, func(c *config.Config) { c.Parallel.CP, c.CP.Attention = 2, "allgather" }},
	{"dp 2 tp 2 pp 2 cp 2", 16, func(c *config.Config) {
		c.Parallel.DP, c.Parallel.TP, c.Parallel.PP, c.Parallel.CP, c.Train.GradAccum = 2, 2, 2, 2, 2
	}},
}

// peakConfig is a model whose parameters, gradients and optimizer state
// are most of a rank's bytes (an 8192-token table 64 wide is over half of
// the model), so a transient the size of a weight, during construction or
// the step, moves the peak by more than the tolerance.
func peakConfig() config.Config {
	c := ptest.Config()
	c.Model.NLayer, c.Model.NHead, c.Model.NEmbd, c.Model.VocabSize, c.Model.BlockSize = 4, 4, 64, 8192, 16
	c.Train.Steps, c.Train.BatchSize, c.Train.GradAccum = 2, 2, 1
	return c
}

// TestPeakWithinEstimateEveryLayout holds every rank's allocator peak,
// from the first parameter built to the end of the second step (nothing
// resets it after set-up; the first step's backward allocates the
// gradients as it goes, and from the second on they are held beside the
// activations, the run's peak the estimate describes), to the estimate of that peak, set-up included
// (PeakBytes + SetupPeakBytes of `tinyacc estimate`), within 10%, for
// every layout. The resident peaks of real processes are held to the
// estimate by TestResidentPeakWithinEstimate in cmd/tinyacc.
func TestPeakWithinEstimateEveryLayout(t *testing.T) {
	for _, l := range peakLayouts {
		t.Run(l.name, func(t *testing.T) {
			cfg := peakConfig()
			l.set(&cfg)
			est, err := Estimate(cfg, l.world)
			require.NoError(t, err)
			got := measure(t, cfg, l.world)
			require.Len(t, got, l.world)
			for r, m := range got {
				want := est[r].PeakBytes + est[r].SetupPeakBytes
				e := est[r]
				t.Logf("%s rank %d: allocator peak %d B, estimate %d B (%+.1f%%); params %d/%d grads %d/%d optim %d/%d act %d/%d comm %d/%d setup %d",
					l.name, r, m.PeakBytes, want, pct(want, m.PeakBytes), m.ParamsBytes, e.ParamsBytes, m.GradsBytes, e.GradsBytes, m.OptimBytes, e.OptimBytes, m.ActPeak, e.ActPeak, m.CommBytes, e.CommBytes, e.SetupPeakBytes)
				require.LessOrEqual(t, math.Abs(float64(want-m.PeakBytes)), 0.10*float64(want),
					"%s rank %d: allocator peak %d B, estimate %d B", l.name, r, m.PeakBytes, want)
			}
		})
	}
}

// TestZeroPeakAtItsMoment holds ZeRO-3's and ZeRO-2's allocator peak to
// the estimate within 1% on shapes whose peak falls at different moments
// of the backward. The parameters, gradients and activations each peak at
// a different moment, so their sum is not the peak: with a table four
// times a block's size the peak is the head's backward (the tied table,
// the head and the last block gathered; the table's and the head's
// gradients; every activation and the logits' gradient), with a small
// table it is the last block's MLP backward (two blocks gathered; that
// block's gradient beside the head's being reduce-scattered), or, with
// more layers, an earlier block's (two blocks' gradients at once, one
// block's activations fewer); a wide model with a long context has most
// of its bytes in activations. Each shape runs two steps with two
// micro-batches where a borrowed shard of a later micro-batch is held.
func TestZeroPeakAtItsMoment(t *testing.T) {
	for _, s := range []struct {
		name                                   string
		stage, world, layers, embd, vocab, ctx int
		accum                                  int
	}{
		{"zero-3 2 layers table", 3, 2, 2, 64, 8192, 16, 1},
		{"zero-3 2 layers blocks", 3, 2, 2, 64, 256, 16, 2},
		{"zero-3 2 layers wide", 3, 2, 2, 128, 1024, 64, 1},
		{"zero-3 8 layers table", 3, 4, 8, 64, 8192, 16, 2},
		{"zero-3 8 layers blocks", 3, 4, 8, 64, 256, 16, 2},
		{"zero-3 8 layers wide", 3, 2, 8, 128, 1024, 64, 1},
		{"zero-2 2 layers blocks", 2, 2, 2, 64, 256, 16, 2},
		{"zero-2 8 layers table", 2, 2, 8, 64, 8192, 16, 1},
	} {
		t.Run(s.name, func(t *testing.T) {
			cfg := peakConfig()
			cfg.Zero.Stage, cfg.Train.GradAccum = s.stage, s.accum
			cfg.Model.NLayer, cfg.Model.NEmbd, cfg.Model.VocabSize, cfg.Model.BlockSize = s.layers, s.embd, s.vocab, s.ctx
			est, err := Estimate(cfg, s.world)
			require.NoError(t, err)
			got := measure(t, cfg, s.world)
			require.Len(t, got, s.world)
			for r, m := range got {
				want := est[r].PeakBytes + est[r].SetupPeakBytes
				sum := est[r].ParamsBytes + est[r].GradsBytes + est[r].OptimBytes + est[r].ActPeak + est[r].CommBytes
				t.Logf("%s rank %d: allocator peak %d B, estimate %d B (%+.2f%%); the categories' own peaks add up to %d B (%+.2f%%)",
					s.name, r, m.PeakBytes, want, pct(want, m.PeakBytes), sum, pct(sum, m.PeakBytes))
				require.LessOrEqual(t, math.Abs(float64(want-m.PeakBytes)), 0.01*float64(want),
					"%s rank %d: allocator peak %d B, estimate %d B", s.name, r, m.PeakBytes, want)
			}
		})
	}
}
