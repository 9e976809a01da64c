package plugins

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// estimateLayouts are the layouts this build registers (one process, DDP
// both modes, ZeRO-1/2/3, each with and without gradient accumulation;
// context parallel with each attention form).
var estimateLayouts = []struct {
	name                string
	world, stage, accum int
	mode                string
	cp                  string // "": no context parallel; else "cp attention split" with parallel.cp = world
}{
	{"one process", 1, 0, 1, "", ""},
	{"one process grad_accum 2", 1, 0, 2, "", ""},
	{"ddp bucketed dp 2", 2, 0, 1, "bucketed", ""},
	{"ddp naive dp 2", 2, 0, 1, "naive", ""},
	{"ddp dp 2 grad_accum 2", 2, 0, 2, "bucketed", ""},
	{"zero-1 dp 2", 2, 1, 1, "", ""},
	{"zero-2 dp 2", 2, 2, 1, "", ""},
	{"zero-3 dp 2", 2, 3, 1, "", ""},
	{"zero-1 dp 2 grad_accum 2", 2, 1, 2, "", ""},
	{"zero-2 dp 2 grad_accum 2", 2, 2, 2, "", ""},
	{"zero-3 dp 2 grad_accum 2", 2, 3, 2, "", ""},
	{"cp 2 ring", 2, 0, 1, "", "ring zigzag"},
	{"cp 2 allgather", 2, 0, 1, "", "allgather zigzag"},
	{"cp 4 ring contiguous", 4, 0, 1, "", "ring contiguous"},
}

// estimateAndMeasure runs a row of the estimate tests: cfg on world
// goroutine ranks under the rows' rules (a head count tensor parallel
// does not split skips the row; a pipeline runs 4 micro-batches), and
// returns the estimate of each rank beside what its allocator measured.
func estimateAndMeasure(t *testing.T, cfg config.Config, world int) ([]trainer.MemoryEstimate, []trainer.MemoryReport) {
	t.Helper()
	if cfg.Model.NHead%cfg.Parallel.TP != 0 {
		t.Skipf("%d heads do not split over tp %d", cfg.Model.NHead, cfg.Parallel.TP)
	}
	if cfg.Parallel.PP > 1 {
		cfg.Train.GradAccum = 4
	}
	est, err := Estimate(cfg, world)
	require.NoError(t, err)
	return est, measure(t, cfg, world)
}

// measure trains cfg on world goroutine ranks through Build and returns
// every rank's memory report.
func measure(t *testing.T, cfg config.Config, world int) []trainer.MemoryReport {
	var mu sync.Mutex
	var out []trainer.MemoryReport
	err := comm.RunLocal(world, comm.Options{}, func(g comm.Group) error {
		ps, m, err := Build(cfg, g)
		if err != nil {
			return err
		}
		tr, err := trainer.New(cfg, trainer.Options{Train: ptest.Corpus(), Plugins: ps, Mesh: m, Rank: g.Rank(), World: g.Size()})
		if err != nil {
			return err
		}
		res, err := tr.Run(context.Background())
		if err != nil {
			return err
		}
		if g.Rank() == 0 {
			mu.Lock()
			out = res.Memory
			mu.Unlock()
		}
		return nil
	})
	require.NoError(t, err)
	return out
}

// TestEstimateMatchesMeasured holds the estimate, made from the config
// alone, to what the run's allocators count, for every layout: params,
// gradients and optimizer state to the byte, activations and the
// simultaneous peak within 15%. An odd width makes ZeRO pad its units, so ranks hold different
// amounts of optimizer state.
func TestEstimateMatchesMeasured(t *testing.T) {
	for _, shape := range [][4]int{{2, 64, 32, 2}, {3, 33, 16, 3}} {
		for _, l := range estimateLayouts {
			t.Run(fmt.Sprintf("L%d C%d T%d/%s", shape[0], shape[1], shape[2], l.name), func(t *testing.T) {
				cfg := ptest.Config()
				cfg.Model.NLayer, cfg.Model.NEmbd, cfg.Model.BlockSize, cfg.Model.NHead = shape[0], shape[1], shape[2], shape[3]
				cfg.Train.Steps, cfg.Train.GradAccum, cfg.Zero.Stage = 2, l.accum, l.stage
				if l.mode != "" {
					cfg.DDP.Mode = l.mode
				}
				if l.cp != "" {
					cfg.Parallel.CP = l.world
					_, err := fmt.Sscan(l.cp, &cfg.CP.Attention, &cfg.CP.Split)
					require.NoError(t, err)
				}
				est, err := Estimate(cfg, l.world)
				require.NoError(t, err)
				got := measure(t, cfg, l.world)
				require.Len(t, est, l.world)
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
					t.Logf("%s rank %d: params %d grads %d optim %d | activations %d est %d (%+.1f%%) | peak %d est %d (%+.1f%%)",
						t.Name()[len("TestEstimateMatchesMeasured/"):], r, m.ParamsBytes, m.GradsBytes, m.OptimBytes, m.ActPeak, e.ActPeak, pct(e.ActPeak, m.ActPeak), m.PeakBytes, e.PeakBytes, pct(e.PeakBytes, m.PeakBytes))
				}
			})
		}
	}
}

func pct(est, got int64) float64 { return 100 * float64(est-got) / float64(got) }

// TestEstimateRefusesLayouts: a layout that does not fit the world is an
// error of the estimate, so train refuses it before spawning.
func TestEstimateRefusesLayouts(t *testing.T) {
	cfg := ptest.Config()
	cfg.Parallel.DP = 3
	_, err := Estimate(cfg, 4)
	require.EqualError(t, err, "config: parallel.dp=3 × tp=1 × pp=1 × cp=1 needs 3 ranks, but the job has 4; set parallel.dp=4, or 0 to use every rank")
}

// TestCheckMemoryNamesTheItem: a limit below the estimate is refused,
// naming the rank, the biggest item and what to change.
func TestCheckMemoryNamesTheItem(t *testing.T) {
	cfg := ptest.Config()
	cfg.Model.NEmbd, cfg.Model.VocabSize, cfg.Train.BatchSize = 64, 50257, 8
	cfg.Data.MaxBytes = 1 << 20
	est, err := Estimate(cfg, 2)
	require.NoError(t, err)
	err = trainer.CheckMemory(est, 200<<20, 2, "200MiB")
	require.Error(t, err)
	require.Contains(t, err.Error(), "memory: rank 0 needs about ")
	require.Contains(t, err.Error(), "but the limit is 100.0 MiB per rank (200.0 MiB shared by 2 ranks on this host) from memory.limit=200MiB; the biggest item is activations (")
	require.Contains(t, err.Error(), "lower train.batch_size")
	require.NoError(t, trainer.CheckMemory(est, 0, 2, "0"), "0 turns the check off")
}
