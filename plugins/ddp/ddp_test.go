package ddp_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/trace"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ddp"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// backends are the comm backends every equivalence test runs on.
var backends = []string{"local", "tcp"}

// variant is one way of configuring the plugin.
type variant struct {
	name              string
	mode              string
	bucketMB, firstMB float64
}

var (
	naive = variant{"naive", ddp.Naive, 0, 0}
	// The test model's gradients are about 0.13 MiB, so the defaults make
	// one bucket and these small caps make many (wte alone is 32 KiB).
	oneBucket   = variant{"bucketed-default", ddp.Bucketed, 25, 1}
	manyBuckets = variant{"bucketed-small", ddp.Bucketed, 0.02, 0.005}
)

// build is v's plugin factory for ptest.
func (v variant) build(world comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) {
	return ptest.DP(v.plugins)(world)
}

func (v variant) plugins(g comm.Group) ([]trainer.Plugin, error) {
	d, err := ddp.New(g, v.mode, v.bucketMB, v.firstMB)
	if err != nil {
		return nil, err
	}
	return []trainer.Plugin{d}, nil
}

// configs returns the single-process config (the global micro-batch in
// one process) and the per-rank config of n ranks over the same samples.
func configs(n, accum int) (single, perRank config.Config) {
	single = ptest.Config()
	single.Train.GradAccum = accum
	perRank = single
	perRank.Train.BatchSize = single.Train.BatchSize / n
	return single, perRank
}

// configs64 is configs on ptest's float64 model, one sequence per rank,
// held to one process at 1e-9.
func configs64(n, accum int) (single, perRank config.Config) {
	single = ptest.Config64()
	single.Train.BatchSize, single.Train.GradAccum = 4, accum
	perRank = single
	perRank.Train.BatchSize = single.Train.BatchSize / n
	return single, perRank
}

// spans returns the events whose name starts with prefix.
func spans(events []trace.Event, prefix string) []trace.Event {
	var out []trace.Event
	for _, e := range events {
		if strings.HasPrefix(e.Name, prefix) {
			out = append(out, e)
		}
	}
	return out
}

// TestEquivalence trains the same model in one process and on n ranks, in
// every mode, with and without gradient accumulation, and holds every rank
// to the single process, the bucketed forms to the naive one, and the
// replicas to each other, in float64.
func TestEquivalence(t *testing.T) {
	singles := map[int]ptest.Result{}
	for _, accum := range []int{1, 2} {
		single, _ := configs64(1, accum)
		singles[accum] = ptest.Single(t, single)
	}
	for _, backend := range backends {
		for _, n := range []int{2, 4} {
			for _, accum := range []int{1, 2} {
				t.Run(fmt.Sprintf("%s/n%d/accum%d", backend, n, accum), func(t *testing.T) {
					_, cfg := configs64(n, accum)
					want := singles[accum]
					ref := ptest.Parallel(t, cfg, n, backend, naive.build)
					for _, v := range []variant{naive, oneBucket, manyBuckets} {
						rs := ref
						if v != naive {
							rs = ptest.Parallel(t, cfg, n, backend, v.build)
						}
						ptest.AssertReplicas(t, rs, v.name)
						for r, res := range rs {
							ptest.AssertEquivalent(t, want, res, fmt.Sprintf("%s rank %d vs single process", v.name, r))
							ptest.AssertEquivalent(t, ref[r], res, fmt.Sprintf("%s rank %d vs naive", v.name, r))
						}
					}
				})
			}
		}
	}
}

// TestOnlyLastMicroBatchCommunicates counts the gradient collectives in
// the trace: one per parameter (naive) or per bucket (bucketed) per step,
// whatever the accumulation, so earlier micro-batches sent nothing.
func TestOnlyLastMicroBatchCommunicates(t *testing.T) {
	const n, accum = 2, 2
	_, cfg := configs(n, accum)
	// 2 layers: wte, wpe, 12 per block, ln_f's two.
	nParams := 2 + 12*cfg.Model.NLayer + 2
	for _, v := range []variant{naive, oneBucket, manyBuckets} {
		t.Run(v.name, func(t *testing.T) {
			var lead *ddp.DDP
			rs := ptest.Parallel(t, cfg, n, "local", ptest.DP(func(g comm.Group) ([]trainer.Plugin, error) {
				ps, err := v.plugins(g)
				if err == nil && g.Rank() == 0 {
					lead = ps[0].(*ddp.DDP)
				}
				return ps, err
			}))
			perStep := nParams
			if v.mode == ddp.Bucketed {
				perStep = len(lead.Buckets())
			}
			for r, res := range rs {
				// Every all-reduce but the loss's and the gradient norm's
				// carries gradients.
				got := len(spans(res.Trace, "all_reduce ")) - len(spans(res.Trace, "all_reduce loss")) - len(spans(res.Trace, "all_reduce grad_norm"))
				require.Equal(t, perStep*cfg.Train.Steps, got, "rank %d: gradient all-reduces", r)
				require.Len(t, spans(res.Trace, "all_reduce loss"), cfg.Train.Steps, "rank %d: loss all-reduces", r)
				require.Len(t, spans(res.Trace, "backward"), accum*cfg.Train.Steps, "rank %d: backward passes", r)
			}
		})
	}
}

func TestNewRejectsBadSettings(t *testing.T) {
	groups, err := comm.NewLocal(1, comm.Options{})
	require.NoError(t, err)
	g := groups[0]
	defer g.Close()
	cases := []struct {
		mode              string
		bucketMB, firstMB float64
		want              string
	}{
		{"ring", 25, 1, `ddp: unknown ddp.mode "ring"; use "naive" or "bucketed"`},
		{"bucketed", 0, 1, "ddp: ddp.bucket_mb is 0; it must be positive (25 is a good default)"},
		{"", -1, 1, "ddp: ddp.bucket_mb is -1; it must be positive (25 is a good default)"},
		{"bucketed", 25, -0.5, "ddp: ddp.first_bucket_mb is -0.5; it must be positive, or 0 for no smaller first bucket"},
	}
	for _, c := range cases {
		_, err := ddp.New(g, c.mode, c.bucketMB, c.firstMB)
		require.EqualError(t, err, c.want)
	}
	_, err = ddp.New(nil, ddp.Naive, 0, 0)
	require.EqualError(t, err, "ddp: no communication group (this rank is not in the data-parallel group)")

	d, err := ddp.New(g, "", 25, 1)
	require.NoError(t, err)
	require.Equal(t, ddp.Bucketed, d.Mode(), "empty mode means bucketed")
	d, err = ddp.New(g, ddp.Naive, 0, 0)
	require.NoError(t, err, "naive mode ignores the bucket sizes")
	require.Equal(t, "ddp", d.Name())
}
