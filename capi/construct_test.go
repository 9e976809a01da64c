package main

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// abiConstructConfig is a model whose parameters dwarf the rest of a rank's
// set-up (a 1024-token vocabulary, 4 blocks of 64 wide), so a whole model
// built and then cut would show against the bound.
func abiConstructConfig() config.Config {
	c := ptest.Config()
	c.Model.NLayer, c.Model.NHead, c.Model.NEmbd, c.Model.VocabSize, c.Model.BlockSize = 4, 4, 64, 1024, 16
	c.Train.Steps, c.Train.BatchSize, c.Train.GradAccum, c.Train.Threads = 1, 2, 1, 1
	return c
}

// abiRank is what one rank holds once the C ABI's calls returned: its
// allocator's accounting, the bytes of its parts and of its largest part,
// and its parts' values (ptest.Result's Initial fields).
type abiRank struct {
	usage         tensor.Usage
	held, largest int64
	initial       ptest.Result
}

// constructThroughABI runs, on n goroutine ranks, what a binding calls:
// tinyacc_model_new, tinyacc_optimizer_new (after loading weights from
// load, when set) and tinyacc_prepare, with the ranks' group in place of
// the launcher's world group.
func constructThroughABI(t *testing.T, cfg config.Config, n int, load string) []abiRank {
	t.Helper()
	out := make([]abiRank, n)
	var mu sync.Mutex
	err := comm.RunLocal(n, comm.Options{Timeout: 60e9}, func(g comm.Group) error {
		ch := register(&configObj{cfg: cfg})
		defer freeHandle(ch)
		mh, err := apiModelNew(ch)
		if err != nil {
			return err
		}
		defer freeHandle(mh)
		if load != "" {
			if err := apiModelLoad(mh, load); err != nil {
				return err
			}
		}
		oh, err := apiOptimizerNew(ch, mh)
		if err != nil {
			return err
		}
		defer freeHandle(oh)
		m, _ := get[modelObj](mh)
		o, _ := get[optimizerObj](oh)
		opts := trainer.Options{Alloc: m.alloc}
		if err := dataParallelOn(cfg, g, &opts); err != nil {
			return err
		}
		tr, err := build(cfg, m, o, nil, nil, opts)
		if err != nil {
			return fmt.Errorf("rank %d: %w", g.Rank(), err)
		}
		r := abiRank{usage: m.alloc.Usage(), initial: ptest.Result{Initial: map[string][]float64{},
			InitialSpecs: map[string]*place.Spec{}, Coord: tr.Coord()}}
		for _, p := range tr.Model.Params() {
			h, err := tr.Holding(p)
			if err != nil {
				return err
			}
			if h.Value.Data == nil {
				continue
			}
			r.initial.Initial[p.Name], r.initial.InitialSpecs[p.Name] = h.Value.Data.Float64s(), h.Value.Spec.Clone()
		}
		if r.held, r.largest, err = ptest.HeldParts(tr); err != nil {
			return err
		}
		mu.Lock()
		out[g.Rank()] = r
		mu.Unlock()
		return nil
	})
	require.NoError(t, err)
	return out
}

// TestABIConstructsOnlyLocalParts: a model created and prepared through
// the C ABI at ZeRO-3 over 2 ranks and at tensor parallel 2, fresh and
// from a weights file loaded before prepare, never had more in any rank's
// allocator than what that rank holds once prepared plus its largest
// single parameter part (parameters alone, and everything with the
// optimizer state), holds a fraction of the model, and starts from
// bitwise one process's weights (trainer.New's, or the file's).
func TestABIConstructsOnlyLocalParts(t *testing.T) {
	base := abiConstructConfig()
	one, err := trainer.New(base, trainer.Options{Train: ptest.Corpus()})
	require.NoError(t, err)
	fresh := ptest.Result{Initial: map[string][]float64{}}
	for _, p := range one.Model.Params() {
		fresh.Initial[p.Name] = p.Float64s()
	}
	other := base
	other.Train.Seed += 5
	w, err := trainer.New(other, trainer.Options{Train: ptest.Corpus()})
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "w.safetensors")
	require.NoError(t, trainer.SaveWeights(w.Model, file))
	loaded := ptest.Result{Initial: map[string][]float64{}}
	for _, p := range w.Model.Params() {
		loaded.Initial[p.Name] = p.Float64s()
	}
	es := int64(trainer.DTypeOf(base).Size())
	whole := es * trainer.GPTConfig(base).NumParams()
	for _, l := range []struct {
		name  string
		apply func(c *config.Config)
	}{
		{"zero3 dp2", func(c *config.Config) { c.Zero.Stage = 3 }},
		{"tp2", func(c *config.Config) { c.Parallel.TP, c.Parallel.DP = 2, 1 }},
	} {
		cfg := base
		l.apply(&cfg)
		for _, from := range []struct {
			what, load string
			want       ptest.Result
		}{{"fresh", "", fresh}, {"model_load", file, loaded}} {
			what := l.name + " " + from.what
			rs := constructThroughABI(t, cfg, 2, from.load)
			got := make([]ptest.Result, len(rs))
			for r, c := range rs {
				got[r] = c.initial
				ptest.AssertConstructionPeak(t, c.usage, c.held, c.largest, whole, 0.60, what, r)
			}
			ptest.AssertInitial(t, from.want, got, what)
		}
	}
}
