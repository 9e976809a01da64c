package pp_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// actPeaks trains one step of schedule with p stages and m micro-batches
// and returns each stage's activation peak, measured by its allocator.
func actPeaks(t *testing.T, schedule string, p, m int) []int64 {
	cfg := base(4, m)
	cfg.Train.Steps = 1
	cfg.Parallel.PP, cfg.PP.Schedule = p, schedule
	got := ptest.Parallel(t, cfg, p, "local", build(cfg))
	out := make([]int64, p)
	for r := range got {
		out[r] = got[r].Memory.ActPeak
	}
	return out
}

// TestActivationMemoryFollowsTheSchedule: AFAB keeps every micro-batch
// alive, so its peak grows with m on every stage; 1F1B keeps at most p-r
// on stage r, so its peak stops growing once m >= p and stays within
// (p-r) times one micro-batch's (AFAB with m = 1). ZB-H1 keeps a
// micro-batch's graph until its W, on every stage up to p micro-batches
// (1F1B's most, that of stage 0; see TestMicroBatchesAlive for the counts
// of every generated schedule): each stage stays within p times its own
// micro-batch under zb1 (m = 1), which weighs more than under AFAB or
// 1F1B, whose backward frees as it goes while a split backward frees
// nothing before its W. Stages are not equal here, though: the last one also holds
// the logits, so its p micro-batches weigh more than stage 0's p and the
// peak over stages is above 1F1B's.
// The paper's "same peak as 1F1B" assumes equal stages.
func TestActivationMemoryFollowsTheSchedule(t *testing.T) {
	for _, p := range []int{2, 4} {
		one := actPeaks(t, "afab", p, 1)
		a2, a4 := actPeaks(t, "afab", p, 2), actPeaks(t, "afab", p, 4)
		f := map[int][]int64{}
		for _, m := range []int{p, 2 * p, 4 * p} {
			f[m] = actPeaks(t, "1f1b", p, m)
		}
		zb, zbOne := actPeaks(t, "zb1", p, 2*p), actPeaks(t, "zb1", p, 1)
		for r := 0; r < p; r++ {
			what := fmt.Sprintf("p=%d stage %d", p, r)
			require.Positive(t, one[r], what)
			require.Greater(t, a2[r], one[r], "%s: afab grows with m", what)
			require.Greater(t, a4[r], a2[r], "%s: afab grows with m", what)
			require.Equal(t, f[p][r], f[2*p][r], "%s: 1f1b does not grow past m = p", what)
			require.Equal(t, f[p][r], f[4*p][r], "%s: 1f1b does not grow past m = p", what)
			require.LessOrEqual(t, f[4*p][r], int64(p-r)*one[r], "%s: 1f1b holds at most p-r micro-batches", what)
			require.LessOrEqual(t, zb[r], int64(p)*zbOne[r], "%s: zb1 holds at most p micro-batches", what)
		}
	}
}

// TestStagesHoldOnlyTheirPart: each stage's parameters, gradients and
// AdamW moments are those of its own blocks (and embedding or head), and
// together the stages hold the model once plus the second copy of wte.
func TestStagesHoldOnlyTheirPart(t *testing.T) {
	cfg := base(4, 2)
	cfg.Train.Steps = 1
	cfg.Parallel.PP = 4
	got := ptest.Parallel(t, cfg, 4, "local", build(cfg))
	var total int64
	for r, g := range got {
		var n int64
		for _, v := range g.Local {
			n += int64(len(v))
		}
		total += n
		require.Equal(t, 4*n, g.Memory.ParamsBytes, "stage %d: parameters", r)
		require.Equal(t, 8*n, g.Memory.OptimBytes, "stage %d: AdamW's two moments", r)
		if r == 0 {
			require.Equal(t, 4*n, g.Memory.GradsBytes, "stage 0: gradients (no received activation to differentiate)")
		}
	}
	gc := cfg.Model
	require.Equal(t, ptestParams(cfg)+int64(gc.VocabSize*gc.NEmbd), total)
}

func ptestParams(cfg config.Config) int64 { return trainer.GPTConfig(cfg).NumParams() }
