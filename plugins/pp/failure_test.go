package pp_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// TestDeadStageIsNamed: when the last stage never trains, the first one
// fails at its first receive within the deadline, and the error names the
// stage it waited for and the action.
func TestDeadStageIsNamed(t *testing.T) {
	cfg := base(4, 2)
	cfg.Parallel.PP = 2
	errs := make([]error, 2)
	_ = comm.RunLocal(2, comm.Options{Timeout: 2 * time.Second}, func(g comm.Group) error {
		ps, m, err := plugins.Build(cfg, g)
		if err != nil {
			return err
		}
		if g.Rank() == 1 {
			return nil // the dead stage
		}
		tr, err := trainer.New(cfg, trainer.Options{Train: ptest.Corpus(), Plugins: ps, Mesh: m, Rank: 0, World: 2})
		if err == nil {
			_, err = tr.Run(context.Background())
		}
		errs[0] = err
		return err
	})
	require.Error(t, errs[0])
	require.Contains(t, errs[0].Error(), "pp: stage 0, action 4 of step 0 (recv-grad chunk 0 micro 0 from rank 1): ")
}
