package zero

import (
	"sort"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// TestShardOptimizerViews prepares stage 1 on 2 ranks and checks the
// optimizer each rank steps: views named after their parameter range,
// gradients that are views of the shard gradient. (Weight decay per view is
// held by the equivalence tests: decaying a LayerNorm weight moves it far
// beyond their tolerance.)
func TestShardOptimizerViews(t *testing.T) {
	cfg := parallelConfig(1, 2, 1)
	names := make([][]string, 2)
	var mu sync.Mutex
	require.NoError(t, comm.RunLocal(2, comm.Options{}, func(g comm.Group) error {
		z, err := New(g, 1)
		if err != nil {
			return err
		}
		tr, err := trainer.New(cfg, trainer.Options{Train: ptest.Corpus(), Plugins: []trainer.Plugin{z}, Rank: g.Rank(), World: 2})
		if err != nil {
			return err
		}
		so, ok := tr.Opt.(*ShardOptimizer)
		require.True(t, ok, "the trainer's optimizer is the shard optimizer")
		var mine []string
		for _, v := range so.Views() {
			mine = append(mine, v.Param.Name)
			require.Len(t, v.Param.Shape(), 1)
			require.Equal(t, v.Piece.Hi-v.Piece.Lo, v.Param.Numel())
			require.Equal(t, v.Param.Numel(), v.Param.Grad.Numel())
			// The view shares storage with the model parameter.
			p := tr.Model.Param(v.Piece.Range.Name)
			require.Equal(t, p.At(v.Piece.Lo), v.Param.At(0), v.Param.Name)
		}
		require.Len(t, so.Params(), len(so.Views()))
		require.Len(t, so.State(), 2*len(so.Views()), "two AdamW moments per view")
		mu.Lock()
		names[g.Rank()] = mine
		mu.Unlock()
		return nil
	}))
	// With Ψ even and every unit even, each unit splits in the middle: the
	// embed unit (wte 256x32, wpe 16x32) halves inside wte.
	require.Equal(t, "wte.weight[0:4352]", names[0][0])
	require.Equal(t, []string{"wte.weight[4352:8192]", "wpe.weight[0:512]"}, names[1][:2])
	all := append(append([]string{}, names[0]...), names[1]...)
	sort.Strings(all)
	require.Contains(t, all, "ln_f.bias[0:32]")
	require.Contains(t, all, "ln_f.weight[0:32]")
}
