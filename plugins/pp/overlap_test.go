package pp_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/trace"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// TestDataParallelOverlapsThePipeline: under pp 2 × dp 2 with bucketed
// DDP, every stage issues bucket all-reduces while the backward of its
// last micro-batch is still running (GradReady reaches DDP from the
// executor's backward); the tied wte's sum over the embedding group runs
// on both ends.
func TestDataParallelOverlapsThePipeline(t *testing.T) {
	cfg := base(4, 2)
	cfg.Train.Steps = 1
	cfg.Parallel.PP = 2
	cfg.DDP.BucketMB, cfg.DDP.FirstBucketMB = 0.02, 0.01
	got := ptest.Parallel(t, cfg, 4, "local", build(cfg))
	for r, res := range got {
		var lastB, tied trace.Event
		var buckets []trace.Event
		for _, e := range res.Trace {
			switch {
			case e.Cat == "pp" && e.Name == "B" && e.TS > lastB.TS:
				lastB = e
			case strings.HasPrefix(e.Name, "all_reduce wte"):
				tied = e
			case strings.HasPrefix(e.Name, "all_reduce bucket"):
				buckets = append(buckets, e)
			}
		}
		require.NotEmpty(t, buckets, "rank %d", r)
		require.Equal(t, 1, lastB.Args["micro"], "rank %d: the last backward is micro-batch 1", r)
		started := 0
		for _, b := range buckets {
			if b.TS < lastB.TS+lastB.Dur {
				started++
			}
		}
		require.Positive(t, started, "rank %d: a bucket all-reduce starts during the last backward", r)
		require.NotEmpty(t, tied.Name, "rank %d: the tied wte's sum", r)
	}
}
