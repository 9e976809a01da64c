package zero

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// build returns the plugin factory of a ZeRO stage for ptest.Parallel.
func build(stage int) ptest.Build {
	return ptest.DP(func(g comm.Group) ([]trainer.Plugin, error) {
		z, err := New(g, stage)
		if err != nil {
			return nil, err
		}
		return []trainer.Plugin{z}, nil
	})
}

// parallelConfig is ptest's model with a per-rank micro-batch of 4 and
// accum micro-batches per step.
func parallelConfig(stage, n, accum int) config.Config {
	cfg := ptest.Config()
	cfg.Train.GradAccum = accum
	cfg.Zero.Stage = stage
	cfg.Parallel.DP = n
	return cfg
}

// equivConfig is the float64 run of the equivalence tests: ptest's
// float64 model, a per-rank micro-batch of 1 and accum micro-batches per
// step.
func equivConfig(stage, n, accum int) config.Config {
	cfg := ptest.Config64()
	cfg.Train.BatchSize, cfg.Train.GradAccum = 1, accum
	cfg.Zero.Stage = stage
	cfg.Parallel.DP = n
	return cfg
}

// singles caches the single-process reference runs of equivConfig, by
// (ranks, accum): the same global batch in one process, trained without
// any plugin.
var singles = struct {
	sync.Mutex
	m map[[2]int]ptest.Result
}{m: map[[2]int]ptest.Result{}}

func single(t *testing.T, n, accum int) ptest.Result {
	singles.Lock()
	defer singles.Unlock()
	k := [2]int{n, accum}
	if r, ok := singles.m[k]; ok {
		return r
	}
	cfg := equivConfig(0, 1, accum)
	cfg.Train.BatchSize = n
	r := ptest.Single(t, cfg)
	singles.m[k] = r
	return r
}

// TestEquivalence trains every stage on 2 and 4 ranks, with and without
// gradient accumulation, over both backends, and holds each rank to the
// single-process run of the same global batch, in float64 (1e-9).
func TestEquivalence(t *testing.T) {
	for _, backend := range []string{"local", "tcp"} {
		for _, stage := range []int{1, 2, 3} {
			for _, n := range []int{2, 4} {
				for _, accum := range []int{1, 2} {
					name := fmt.Sprintf("%s/stage%d/n%d/accum%d", backend, stage, n, accum)
					t.Run(name, func(t *testing.T) {
						want := single(t, n, accum)
						rs := ptest.Parallel(t, equivConfig(stage, n, accum), n, backend, build(stage))
						ptest.Check(t, want, rs, name)
					})
				}
			}
		}
	}
}

// TestPaddedUnits runs on 3 ranks, where no unit of the model divides
// evenly, so every unit carries padding and shards split parameters.
func TestPaddedUnits(t *testing.T) {
	for _, stage := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("stage%d", stage), func(t *testing.T) {
			want := single(t, 3, 1)
			rs := ptest.Parallel(t, equivConfig(stage, 3, 1), 3, "local", build(stage))
			ptest.Check(t, want, rs, fmt.Sprintf("stage %d", stage))
		})
	}
}

func TestNewRejectsBadArguments(t *testing.T) {
	_, err := New(nil, 1)
	require.EqualError(t, err, "zero: no data-parallel group (nil comm.Group)")
	require.NoError(t, comm.RunLocal(1, comm.Options{}, func(g comm.Group) error {
		_, err := New(g, 4)
		require.EqualError(t, err, "zero: stage 4 is not 1, 2 or 3 (set zero.stage; 0 means plain data parallel)")
		return nil
	}))
}

// TestPrefetchChangesNothing runs stage 3 with and without prefetching:
// the same collectives on the same data, only issued earlier, so the
// results must be bitwise the same. Kernels run on one thread here: with
// several ranks sharing the kernel thread pool, multi-threaded runs are not
// bitwise reproducible even without any sharding.
func TestPrefetchChangesNothing(t *testing.T) {
	threads := cpu.Threads()
	t.Cleanup(func() { cpu.SetThreads(threads) })
	cfg := parallelConfig(3, 2, 2)
	cfg.Train.Steps = 4
	cfg.Train.Threads = 1
	with := ptest.Parallel(t, cfg, 2, "local", build(3))
	without := ptest.Parallel(t, cfg, 2, "local", ptest.DP(func(g comm.Group) ([]trainer.Plugin, error) {
		z, err := New(g, 3)
		if err != nil {
			return nil, err
		}
		z.Prefetch = false
		return []trainer.Plugin{z}, nil
	}))
	for r := range with {
		require.Equal(t, with[r].Losses, without[r].Losses, "rank %d losses", r)
		require.Equal(t, with[r].Params, without[r].Params, "rank %d parameters", r)
	}
}
