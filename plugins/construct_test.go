package plugins

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// constructConfig is a model whose parameters dwarf the rest of a rank's
// set-up (a 1024-token vocabulary, 4 blocks of 64 wide), so a whole tensor
// built and then cut would show against the bound.
func constructConfig() config.Config {
	c := ptest.Config()
	c.Model.NLayer, c.Model.NHead, c.Model.NEmbd, c.Model.VocabSize, c.Model.BlockSize = 4, 4, 64, 1024, 16
	c.Train.Steps, c.Train.BatchSize, c.Train.GradAccum = 1, 4, 1
	return c
}

// constructed is what one rank holds once trainer.New (and a resume)
// returned: its allocator's accounting, and from its placement the bytes
// of its parts and of its largest part.
type constructed struct {
	usage            tensor.Usage
	held, largest    int64
	units, dataRanks int
}

// construct builds cfg on n goroutine ranks, each with its own
// allocator, loads the checkpoint at resume when set, and reports every
// rank.
func construct(t *testing.T, cfg config.Config, n int, resume string) []constructed {
	t.Helper()
	out := make([]constructed, n)
	var mu sync.Mutex
	err := comm.RunLocal(n, comm.Options{Timeout: 60e9}, func(g comm.Group) error {
		ps, m, err := Build(cfg, g)
		if err != nil {
			return err
		}
		alloc := tensor.NewAllocator()
		tr, err := trainer.New(cfg, trainer.Options{Train: ptest.Corpus(), Plugins: ps, Mesh: m, Rank: g.Rank(), World: n, Alloc: alloc})
		if err != nil {
			return fmt.Errorf("rank %d: %w", g.Rank(), err)
		}
		if resume != "" {
			if _, err := tr.LoadCheckpoint(resume); err != nil {
				return fmt.Errorf("rank %d: %w", g.Rank(), err)
			}
		}
		c := constructed{usage: alloc.Usage(), units: len(tr.Model.Modules()), dataRanks: tr.DataSize}
		if c.held, c.largest, err = ptest.HeldParts(tr); err != nil {
			return err
		}
		mu.Lock()
		out[g.Rank()] = c
		mu.Unlock()
		return nil
	})
	require.NoError(t, err)
	return out
}

// assertConstructionBounded: each rank's allocator peak during
// construction (and loading) is at most what it holds once built plus its
// largest single parameter part; what it holds of the parameters is its
// placement's parts (ZeRO's unit padding aside); and those are a fraction
// of the whole model, so the bound means something.
func assertConstructionBounded(t *testing.T, cfg config.Config, rs []constructed, what string) {
	t.Helper()
	es := int64(trainer.DTypeOf(cfg).Size())
	whole := es * trainer.GPTConfig(cfg).NumParams()
	for r, c := range rs {
		params := c.usage.Current[tensor.Params]
		require.LessOrEqual(t, params, c.held+es*int64(c.units*c.dataRanks), "%s, rank %d: parameter bytes beyond its parts and their padding", what, r)
		ptest.AssertConstructionPeak(t, c.usage, c.held, c.largest, whole, 0.45, what, r)
	}
}

// constructLayouts are the layouts whose ranks hold a fraction of the
// model: tensor parallel 4, a pipeline of 4 stages, ZeRO-3 over 4 ranks,
// each with one process's global batch of 4 sequences (so each can resume
// one process's checkpoint).
var constructLayouts = []struct {
	name  string
	apply func(c *config.Config)
}{
	{"tp4", func(c *config.Config) { c.Parallel.TP, c.Parallel.DP = 4, 1 }},
	{"pp4 1f1b", func(c *config.Config) {
		c.Parallel.PP, c.Parallel.DP, c.Train.BatchSize, c.Train.GradAccum = 4, 1, 1, 4
	}},
	{"zero3 dp4", func(c *config.Config) { c.Zero.Stage, c.Train.BatchSize = 3, 1 }},
}

// TestConstructionHoldsOnlyLocalParts: fresh, from init_from (a whole
// weights file one process saved) and resumed (a checkpoint of one
// process, whose pieces are whole tensors), no rank's allocator ever holds
// more than its own parts and one part besides.
func TestConstructionHoldsOnlyLocalParts(t *testing.T) {
	dir := t.TempDir()
	base := constructConfig()
	one, err := trainer.New(base, trainer.Options{Train: ptest.Corpus()})
	require.NoError(t, err)
	weights := filepath.Join(dir, "w.safetensors")
	require.NoError(t, trainer.SaveWeights(one.Model, weights))
	_, err = one.Run(context.Background())
	require.NoError(t, err)
	saved, err := one.SaveCheckpoint(filepath.Join(dir, "ckpt"), 1)
	require.NoError(t, err)
	_, err = ckpt.ReadIndex(saved)
	require.NoError(t, err)
	for _, l := range constructLayouts {
		cfg := base
		l.apply(&cfg)
		t.Run(l.name, func(t *testing.T) {
			assertConstructionBounded(t, cfg, construct(t, cfg, 4, ""), l.name)
			from := cfg
			from.InitFrom = weights
			assertConstructionBounded(t, from, construct(t, from, 4, ""), l.name+" init_from")
			assertConstructionBounded(t, cfg, construct(t, cfg, 4, saved), l.name+" resume")
		})
	}
}

// TestLoadWeightsIntoEveryLayout: a weights file one process saved (with
// another seed) loaded into a built trainer of tensor parallel 2, a
// pipeline of 2 and ZeRO-3 over 2 ranks (Trainer.LoadWeights, the bindings'
// load once a model is prepared) gives every rank exactly the file's
// numbers in every part it holds, the parts covering every element.
func TestLoadWeightsIntoEveryLayout(t *testing.T) {
	dir := t.TempDir()
	other := ptest.Config()
	other.Train.Seed += 11
	one, err := trainer.New(other, trainer.Options{Train: ptest.Corpus()})
	require.NoError(t, err)
	path := filepath.Join(dir, "w.safetensors")
	require.NoError(t, trainer.SaveWeights(one.Model, path))
	want := ptest.Result{Initial: ptest.LoadParams(t, path)}
	for _, l := range []struct {
		name  string
		apply func(c *config.Config)
	}{
		{"tp2", func(c *config.Config) { c.Parallel.TP, c.Parallel.DP = 2, 1 }},
		{"pp2", func(c *config.Config) { c.Parallel.PP, c.Parallel.DP, c.Train.GradAccum = 2, 1, 2 }},
		{"zero3 dp2", func(c *config.Config) { c.Zero.Stage = 3 }},
	} {
		cfg := ptest.Config()
		l.apply(&cfg)
		got := make([]ptest.Result, 2)
		err := comm.RunLocal(2, comm.Options{Timeout: 60e9}, func(g comm.Group) error {
			ps, m, err := Build(cfg, g)
			if err != nil {
				return err
			}
			tr, err := trainer.New(cfg, trainer.Options{Train: ptest.Corpus(), Plugins: ps, Mesh: m, Rank: g.Rank(), World: 2})
			if err != nil {
				return err
			}
			if err := tr.LoadWeights(path); err != nil {
				return err
			}
			r := ptest.Result{Initial: map[string][]float64{}, InitialSpecs: map[string]*place.Spec{}, Coord: tr.Coord()}
			for _, p := range tr.Model.Params() {
				h, err := tr.Holding(p)
				if err != nil {
					return err
				}
				if h.Value.Data != nil {
					r.Initial[p.Name], r.InitialSpecs[p.Name] = h.Value.Data.Float64s(), h.Value.Spec.Clone()
				}
			}
			got[g.Rank()] = r
			return nil
		})
		require.NoError(t, err, l.name)
		ptest.AssertInitial(t, want, got, l.name+" after LoadWeights")
	}
}
