package pp_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/data"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins"
)

// evals trains cfg on n ranks (n = 1: one process) and returns every
// rank's validation losses.
func evals(t *testing.T, cfg config.Config, n int) [][]trainer.EvalPoint {
	corpus := data.Encode(strings.Repeat("func main() { fmt.Println(\"hello, tinyacc\") }\n// a comment\n", 80))
	cut := len(corpus) * 4 / 5
	out := make([][]trainer.EvalPoint, n)
	train := func(g comm.Group) error {
		opts := trainer.Options{Train: corpus[:cut], Val: corpus[cut:], World: 1}
		if g != nil {
			ps, m, err := plugins.Build(cfg, g)
			if err != nil {
				return err
			}
			opts.Plugins, opts.Mesh, opts.Rank, opts.World = ps, m, g.Rank(), g.Size()
		}
		tr, err := trainer.New(cfg, opts)
		if err != nil {
			return err
		}
		res, err := tr.Run(context.Background())
		out[opts.Rank] = res.Evals
		return err
	}
	if n == 1 {
		require.NoError(t, train(nil))
	} else {
		require.NoError(t, comm.RunLocal(n, comm.Options{}, train))
	}
	return out
}

// TestEvaluationThroughThePipeline: validation losses go through the
// executor's forward-only pass and equal one process's, on every stage.
func TestEvaluationThroughThePipeline(t *testing.T) {
	cfg := base(4, 2)
	cfg.Train.Steps, cfg.Train.EvalEvery, cfg.Train.EvalBatches = 4, 2, 2
	want := evals(t, single(cfg, 1), 1)[0]
	require.Len(t, want, 2)
	for _, s := range []string{"1f1b", "interleaved"} {
		c := cfg
		c.Parallel.PP, c.PP.Schedule = 2, s
		if s == "interleaved" {
			c.PP.VirtualStages = 2
		}
		for r, got := range evals(t, c, 2) {
			require.Len(t, got, len(want))
			for i := range want {
				require.Equal(t, want[i].Step, got[i].Step)
				require.InEpsilon(t, want[i].Loss, got[i].Loss, 1e-5, fmt.Sprintf("%s rank %d eval %d", s, r, i))
			}
		}
	}
}
