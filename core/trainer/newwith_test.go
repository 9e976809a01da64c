package trainer

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/data"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// TestNewWithTrainsLikeNew builds the model, optimizer and loaders outside
// the trainer, as the C ABI does, and checks the steps equal New's run.
func TestNewWithTrainsLikeNew(t *testing.T) {
	cfg := smallConfig()
	want := runLosses(t, cfg)

	alloc := tensor.NewAllocator()
	m, err := BuildModel(cfg, alloc)
	require.NoError(t, err)
	opt := BuildOptimizer(cfg, m.Params(), alloc)
	train, err := data.NewLoader(corpus[:4000], cfg.Model.BlockSize, cfg.Data.Order, cfg.Train.Seed)
	require.NoError(t, err)
	tr, err := NewWith(cfg, m, opt, train, nil, Options{Alloc: alloc})
	require.NoError(t, err)
	require.Same(t, m, tr.Model)
	require.Equal(t, 1, tr.World)
	var got []float64
	for s := range cfg.Train.Steps {
		sm, err := tr.Step(s)
		require.NoError(t, err)
		got = append(got, sm.Loss)
	}
	require.Equal(t, want, got)
}

// rankPlugin stands in for a data-parallel plugin: Prepare places the
// trainer in a data-parallel group.
type rankPlugin struct{ saw *Trainer }

func (p *rankPlugin) Name() string { return "ranks" }

func (p *rankPlugin) Prepare(t *Trainer) error {
	p.saw = t
	t.DataRank, t.DataSize = 1, 2
	return nil
}

func TestNewWithPreparesPlugins(t *testing.T) {
	cfg := smallConfig()
	m, err := BuildModel(cfg, nil)
	require.NoError(t, err)
	opt := BuildOptimizer(cfg, m.Params(), nil)
	p := &rankPlugin{}
	tr, err := NewWith(cfg, m, opt, nil, nil, Options{Plugins: []Plugin{p}, Rank: 1, World: 2})
	require.NoError(t, err)
	require.Same(t, tr, p.saw)
	require.Equal(t, []int{1, 2, 1, 2}, []int{tr.DataRank, tr.DataSize, tr.Rank, tr.World})

	_, err = NewWith(cfg, m, nil, nil, nil, Options{Plugins: []Plugin{&rankPlugin{}}})
	require.EqualError(t, err, "trainer: plugin ranks needs an optimizer to prepare; pass one (or no plugins for forward passes only)")
	_, err = NewWith(cfg, m, opt, nil, nil, Options{Plugins: []Plugin{&rankPlugin{}, &rankPlugin{}}})
	require.EqualError(t, err, `trainer: plugin "ranks" given twice`)
}
