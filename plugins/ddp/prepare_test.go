package ddp_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/data"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ddp"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// run runs fn on n ranks of backend.
func run(t *testing.T, backend string, n int, fn func(g comm.Group) error) {
	t.Helper()
	var err error
	switch backend {
	case "local":
		err = comm.RunLocal(n, comm.Options{}, fn)
	case "tcp":
		err = comm.RunTCPLocal(n, comm.Options{}, fn)
	default:
		t.Fatalf("unknown backend %q", backend)
	}
	require.NoError(t, err)
}

// numParams counts the test GPT's parameters from its shape.
func numParams(c config.Config) int64 {
	C := c.Model.NEmbd
	return int64(c.Model.VocabSize*C + c.Model.BlockSize*C + c.Model.NLayer*(12*C*C+13*C) + 2*C)
}

// TestPrepareBroadcastsRankZero gives every rank a model built with its
// own seed (NewWith: a caller's weights, as the bindings pass them): after
// Prepare every rank holds the weights rank 0's seed makes, and reads its
// own slice of the data. (trainer.New fills every rank from one seed after
// Prepare, so there is nothing to broadcast there.)
func TestPrepareBroadcastsRankZero(t *testing.T) {
	want, err := trainer.New(ptest.Config(), trainer.Options{Train: ptest.Corpus()})
	require.NoError(t, err)
	for _, backend := range backends {
		for _, v := range []variant{naive, manyBuckets} {
			t.Run(backend+"/"+v.name, func(t *testing.T) {
				const n = 3
				run(t, backend, n, func(g comm.Group) error {
					cfg := ptest.Config()
					cfg.Train.Seed += int64(g.Rank()) * 7
					ps, err := v.plugins(g)
					if err != nil {
						return err
					}
					alloc := tensor.NewAllocator()
					m, err := trainer.BuildModel(cfg, alloc)
					if err != nil {
						return err
					}
					l, err := data.NewLoader(ptest.Corpus(), cfg.Model.BlockSize, cfg.Data.Order, cfg.Train.Seed)
					if err != nil {
						return err
					}
					tr, err := trainer.NewWith(cfg, m, trainer.BuildOptimizer(cfg, m.Params(), alloc), l, nil, trainer.Options{Plugins: ps, Alloc: alloc})
					if err != nil {
						return err
					}
					if tr.DataRank != g.Rank() || tr.DataSize != n {
						return fmt.Errorf("rank %d: data rank %d of %d", g.Rank(), tr.DataRank, tr.DataSize)
					}
					for _, p := range want.Model.Params() {
						got := tr.Model.Param(p.Name)
						if !slices.Equal(p.Float64s(), got.Float64s()) {
							return fmt.Errorf("rank %d: %s is not rank 0's", g.Rank(), p.Name)
						}
					}
					return nil
				})
			})
		}
	}
}

func TestPrepareRejectsWrongDP(t *testing.T) {
	run(t, "local", 2, func(g comm.Group) error {
		cfg := ptest.Config()
		cfg.Parallel.DP = 4
		d, err := ddp.New(g, ddp.Naive, 0, 0)
		if err != nil {
			return err
		}
		_, err = trainer.New(cfg, trainer.Options{Train: ptest.Corpus(), Plugins: []trainer.Plugin{d}})
		const want = `trainer: prepare ddp: ddp: parallel.dp is 4 but data-parallel group "world" has 2 ranks; set parallel.dp to 2 or 0`
		if err == nil || err.Error() != want {
			return fmt.Errorf("rank %d: got error %v, want %s", g.Rank(), err, want)
		}
		return nil
	})
}

// TestMemoryIsReplicated checks the accounting of plain data parallel:
// every rank holds the whole model, its gradients (in buckets or not) and
// the optimizer state, 4Ψ + 4Ψ + 8Ψ bytes in fp32, as one process does.
func TestMemoryIsReplicated(t *testing.T) {
	_, cfg := configs(2, 1)
	psi := numParams(cfg)
	for _, v := range []variant{naive, oneBucket, manyBuckets} {
		for r, res := range ptest.Parallel(t, cfg, 2, "local", v.build) {
			m := res.Memory
			require.Equal(t, 4*psi, m.ParamsBytes, "%s rank %d params", v.name, r)
			require.Equal(t, 4*psi, m.GradsBytes, "%s rank %d grads", v.name, r)
			require.Equal(t, 8*psi, m.OptimBytes, "%s rank %d optimizer state", v.name, r)
			require.Zero(t, m.CommBytes, "%s rank %d: all-reduces run in place", v.name, r)
		}
	}
}
