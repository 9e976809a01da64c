package plugins

import (
	"fmt"
	"math"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// Activation recomputation changes what is kept between forward and
// backward, never a number: under every granularity, and with only the
// first block recomputing, a layout's losses, gradient norms and final
// weights are bitwise those of the same layout keeping every activation.

// recomputeRows are the granularities held to none.
var recomputeRows = []struct {
	name  string
	apply func(c *config.Config)
}{
	{"selective", func(c *config.Config) {
		c.Recompute.Granularity, c.Recompute.Modules = "selective", []string{"norm", "mlp_act", "attn_core"}
	}},
	{"full", func(c *config.Config) { c.Recompute.Granularity = "full" }},
	{"full blocks=1", func(c *config.Config) { c.Recompute.Granularity, c.Recompute.Blocks = "full", 1 }},
}

// recomputeLayouts are the layouts, each applied to matrixConfig.
var recomputeLayouts = []struct {
	name  string
	ranks int
	apply func(c *config.Config)
}{
	{"one process", 1, func(c *config.Config) {}},
	{"dp2", 2, func(c *config.Config) { shape4{2, 1, 1, 1}.apply(c) }},
	{"tp2 sp", 2, func(c *config.Config) { shape4{1, 2, 1, 1}.apply(c); c.TP.SequenceParallel = true }},
	{"pp2 1f1b", 2, func(c *config.Config) { shape4{1, 1, 2, 1}.apply(c) }},
	{"pp2 zb1", 2, func(c *config.Config) { shape4{1, 1, 2, 1}.apply(c); c.PP.Schedule = "zb1" }},
	{"cp2 ring", 2, func(c *config.Config) { shape4{1, 1, 1, 2}.apply(c) }},
	{"zero3 dp2", 2, func(c *config.Config) { shape4{2, 1, 1, 1}.apply(c); c.Zero.Stage = 3 }},
	{"dp2 tp2 pp2 cp2 sp", 16, func(c *config.Config) { shape4{2, 2, 2, 2}.apply(c); c.TP.SequenceParallel = true }},
}

// runLayout trains cfg as one process or on its ranks (goroutines) and
// returns rank 0's result, with every rank's results for the caller to
// compare.
func runLayout(t *testing.T, cfg config.Config, n int) []ptest.Result {
	t.Helper()
	require.NoError(t, cfg.Validate())
	if n == 1 {
		return []ptest.Result{ptest.Single(t, cfg)}
	}
	return ptest.Parallel(t, cfg, n, "local", func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) { return Build(cfg, g) })
}

// assertBitwise holds got to want exactly: losses, gradient norms and
// every global parameter after the last step.
func assertBitwise(t *testing.T, want, got []ptest.Result, what string) {
	t.Helper()
	require.Len(t, got, len(want), what)
	for r := range want {
		require.Equal(t, want[r].Losses, got[r].Losses, "%s rank %d: losses", what, r)
		require.Equal(t, want[r].GradNorms, got[r].GradNorms, "%s rank %d: gradient norms", what, r)
		require.Equal(t, len(want[r].Params), len(got[r].Params), "%s rank %d: parameters", what, r)
		for name, w := range want[r].Params {
			require.Equal(t, w, got[r].Params[name], "%s rank %d: %s", what, r, name)
		}
	}
}

func TestRecomputeIsBitwise(t *testing.T) {
	for _, l := range recomputeLayouts {
		t.Run(l.name, func(t *testing.T) {
			if l.ranks > 2 && testing.Short() {
				t.Skip("16 goroutine ranks; skipped with -short")
			}
			base := matrixConfig()
			l.apply(&base)
			want := runLayout(t, base, l.ranks)
			for _, row := range recomputeRows {
				cfg := base
				row.apply(&cfg)
				got := runLayout(t, cfg, l.ranks)
				what := fmt.Sprintf("%s, %s", l.name, row.name)
				assertBitwise(t, want, got, what)
				t.Logf("%s: bytes sent per step by rank 0: %v, without recomputation %v", what, got[0].CommBytes, want[0].CommBytes)
				if row.name == "selective" {
					require.Equal(t, want[0].CommBytes, got[0].CommBytes, "%s: selective recomputation communicates nothing", what)
					continue
				}
				// The recomputed forward of k blocks repeats its
				// communication per micro-batch: under sequence parallel
				// two all-gathers and two reduce-scatters of B·T·C
				// (a rank sends half), in the ring one key/value block
				// 2·B·(T/2)·C; ZeRO-3 gathers for the recomputed forward
				// the unit its backward gathered, and keeps it for that
				// backward: no extra bytes.
				k := int64(trainer.RecomputedBlocks(cfg, cfg.Model.NLayer))
				B, T, C := int64(cfg.Train.BatchSize), int64(cfg.Model.BlockSize), int64(cfg.Model.NEmbd)
				var extra int64
				switch l.name {
				case "tp2 sp":
					extra = 4 * B * T * C / 2
				case "cp2 ring":
					extra = 2 * B * (T / 2) * C
				case "dp2 tp2 pp2 cp2 sp":
					continue // both at once, on halves of the model: the rows above count each
				}
				for s := range want[0].CommBytes {
					require.Equal(t, want[0].CommBytes[s]+8*k*int64(cfg.Train.GradAccum)*extra, got[0].CommBytes[s], "%s step %d: bytes sent", what, s)
				}
			}
		})
	}
}

// TestRecomputeMemoryMatchesEstimate holds each granularity's activation
// peak, as the allocator counts it, to the estimate within 5% on the
// demo model (the defaults: 4 blocks, 128 wide, context 128, batch 8), and
// orders them: full below selective below none.
func TestRecomputeMemoryMatchesEstimate(t *testing.T) {
	peaks := map[string]int64{}
	for _, row := range []struct {
		name  string
		apply func(c *config.Config)
	}{
		{"none", func(c *config.Config) {}},
		{"selective", func(c *config.Config) { c.Recompute.Granularity = "selective" }},
		{"selective all", func(c *config.Config) {
			c.Recompute.Granularity, c.Recompute.Modules = "selective", []string{"norm", "mlp_act", "attn_core"}
		}},
		{"full", func(c *config.Config) { c.Recompute.Granularity = "full" }},
		{"full blocks=2", func(c *config.Config) { c.Recompute.Granularity, c.Recompute.Blocks = "full", 2 }},
	} {
		cfg := config.Defaults()
		cfg.Train.Steps, cfg.Train.EvalEvery, cfg.Data.ValFraction = 2, 0, 0
		row.apply(&cfg)
		est, err := Estimate(cfg, 1)
		require.NoError(t, err)
		got := measure(t, cfg, 1)[0].ActPeak
		want := est[0].ActPeak
		t.Logf("%s: activations %d, estimated %d (%+.1f%%)", row.name, got, want, pct(want, got))
		require.LessOrEqual(t, math.Abs(float64(want-got)), 0.05*float64(got), "%s: estimated %d, measured %d", row.name, want, got)
		peaks[row.name] = got
	}
	require.Less(t, peaks["full"], peaks["selective"])
	require.Less(t, peaks["selective"], peaks["none"])
}

// TestRecomputeMemoryLayouts holds each rank's activation peak to the
// estimate within 5% under every granularity for the layouts that
// change what a rank keeps: tensor parallel (with and without sequence
// parallel, whose LayerNorms keep their outputs), pipelines (1f1b, and
// zb1, whose split backward frees nothing before its W) and context
// parallel (ring attention keeps its output), on the demo model made
// narrower (64 wide, context 64, batch 4) to keep 25 runs short.
func TestRecomputeMemoryLayouts(t *testing.T) {
	if testing.Short() {
		t.Skip("25 runs of 2 goroutine ranks; skipped with -short")
	}
	for _, l := range []struct {
		name  string
		apply func(c *config.Config)
	}{
		{"tp2", func(c *config.Config) { c.Parallel.TP = 2 }},
		{"tp2 sp", func(c *config.Config) { c.Parallel.TP, c.TP.SequenceParallel = 2, true }},
		{"pp2 1f1b", func(c *config.Config) { c.Parallel.PP, c.Train.GradAccum = 2, 4 }},
		{"pp2 zb1", func(c *config.Config) { c.Parallel.PP, c.Train.GradAccum, c.PP.Schedule = 2, 4, "zb1" }},
		{"cp2 ring", func(c *config.Config) { c.Parallel.CP = 2 }},
	} {
		for _, row := range append([]struct {
			name  string
			apply func(c *config.Config)
		}{{"none", func(c *config.Config) {}}}, recomputeRows...) {
			t.Run(l.name+"/"+row.name, func(t *testing.T) {
				cfg := config.Defaults()
				cfg.Train.Steps, cfg.Train.EvalEvery, cfg.Data.ValFraction = 2, 0, 0
				cfg.Model.NEmbd, cfg.Model.BlockSize, cfg.Train.BatchSize = 64, 64, 4
				l.apply(&cfg)
				row.apply(&cfg)
				est, err := Estimate(cfg, 2)
				require.NoError(t, err)
				for r, m := range measure(t, cfg, 2) {
					want := est[r].ActPeak
					t.Logf("rank %d: activations %d, estimated %d (%+.1f%%)", r, m.ActPeak, want, pct(want, m.ActPeak))
					require.LessOrEqual(t, math.Abs(float64(want-m.ActPeak)), 0.05*float64(m.ActPeak), "rank %d: estimated %d, measured %d", r, want, m.ActPeak)
				}
			})
		}
	}
}

// TestRecomputeResume: a checkpoint saved by a run under full recompute
// holds no trace of it; resumed without recomputation (and the other way
// round), one process and ZeRO-3 at dp 2 continue bitwise as the
// uninterrupted run without recomputation.
func TestRecomputeResume(t *testing.T) {
	for _, l := range []layout{layouts[0], layouts[5]} {
		whole := l.run(t, l.config64(resumeSteps), "local")
		for _, pair := range [][2]string{{"full", "none"}, {"none", "full"}, {"selective", "none"}} {
			dir := filepath.Join(t.TempDir(), "ckpt")
			cfg := l.config64(resumeSave)
			cfg.Checkpoint.Dir, cfg.Recompute.Granularity = dir, pair[0]
			l.run(t, cfg, "local")
			cfg = l.config64(resumeSteps)
			cfg.Resume, cfg.Recompute.Granularity = dir, pair[1]
			got := l.run(t, cfg, "local")
			what := fmt.Sprintf("%s: saved under %s, resumed under %s", l.name, pair[0], pair[1])
			require.Equal(t, whole.Losses[resumeSave:], got.Losses, what)
			require.Equal(t, whole.GradNorms[resumeSave:], got.GradNorms, what)
			require.Equal(t, whole.Params, got.Params, what)
		}
	}
}

// TestRecomputeLlamaIsBitwise: a Llama's RMSNorm and SwiGLU gate form
// their outputs again bitwise, so selective (and full) recomputation of a
// Llama equals the run keeping every activation, in one process and
// under tensor + sequence parallel; selective keeps less than none.
func TestRecomputeLlamaIsBitwise(t *testing.T) {
	for _, l := range []struct {
		name  string
		ranks int
		apply func(c *config.Config)
	}{
		{"one process", 1, func(c *config.Config) {}},
		{"tp2 sp", 2, func(c *config.Config) { shape4{1, 2, 1, 1}.apply(c); c.TP.SequenceParallel = true }},
	} {
		t.Run(l.name, func(t *testing.T) {
			base := llamaMatrixConfig(false)
			l.apply(&base)
			want := runLayout(t, base, l.ranks)
			for _, row := range recomputeRows {
				cfg := base
				row.apply(&cfg)
				assertBitwise(t, want, runLayout(t, cfg, l.ranks), "llama "+l.name+", "+row.name)
			}
		})
	}
	cfg := llamaMatrixConfig(false)
	cfg.Train.EvalEvery, cfg.Data.ValFraction = 0, 0
	none := measure(t, cfg, 1)[0].ActPeak
	cfg.Recompute.Granularity = "selective"
	sel := measure(t, cfg, 1)[0].ActPeak
	t.Logf("llama activations: none %d, selective %d", none, sel)
	require.Less(t, sel, none, "selective recomputation of a Llama drops nothing")
}
