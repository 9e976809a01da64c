package ddp_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/comm/commtest"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trace"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ddp"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// named returns the events called exactly name.
func named(events []trace.Event, name string) []trace.Event {
	var out []trace.Event
	for _, e := range events {
		if e.Name == name {
			out = append(out, e)
		}
	}
	return out
}

func end(e trace.Event) float64 { return e.TS + e.Dur }

// TestBucketsOverlapBackward reads the ranks' traces: in bucketed mode the
// bucket all-reduces are issued while the last micro-batch's backward is
// still running, and each completes before the optimizer step; in naive
// mode nothing is sent until backward is over.
func TestBucketsOverlapBackward(t *testing.T) {
	for _, backend := range backends {
		for _, accum := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s/accum%d", backend, accum), func(t *testing.T) {
				const n = 2
				_, cfg := configs(n, accum)
				nParams := int64(cfg.Model.VocabSize*cfg.Model.NEmbd + cfg.Model.BlockSize*cfg.Model.NEmbd +
					cfg.Model.NLayer*(12*cfg.Model.NEmbd*cfg.Model.NEmbd+13*cfg.Model.NEmbd) + 2*cfg.Model.NEmbd)

				for r, res := range ptest.Parallel(t, cfg, n, backend, manyBuckets.build) {
					backward := named(res.Trace, "backward")
					opt := named(res.Trace, "optimizer")
					buckets := spans(res.Trace, "all_reduce bucket ")
					require.Len(t, backward, accum*cfg.Train.Steps)
					require.Len(t, opt, cfg.Train.Steps)
					require.NotEmpty(t, buckets)

					// The property overlap is about: communication starts
					// before the rank's last backward is over.
					require.Less(t, buckets[0].TS, end(backward[len(backward)-1]), "rank %d", r)

					bytes := make([]int64, cfg.Train.Steps)
					for _, e := range buckets {
						require.Equal(t, "comm", e.Cat)
						require.Equal(t, trace.Comm, e.TID)
						// Issued inside the backward of a last micro-batch.
						inside := -1
						for i, b := range backward {
							if b.TS <= e.TS && e.TS <= end(b) {
								inside = i
							}
						}
						require.GreaterOrEqual(t, inside, 0, "rank %d: %s at %.1fµs is outside every backward", r, e.Name, e.TS)
						require.Equal(t, accum-1, backward[inside].Args["micro"], "rank %d: %s issued during an earlier micro-batch", r, e.Name)
						step := inside / accum
						// Complete (span closed) before that step's optimizer.
						require.LessOrEqual(t, end(e), opt[step].TS, "rank %d: %s still running at step %d's optimizer", r, e.Name, step)
						bytes[step] += int64(e.Args["bytes"].(int64))
					}
					for s, b := range bytes {
						require.Equal(t, 4*nParams, b, "rank %d step %d: bytes all-reduced", r, s)
					}
				}

				for r, res := range ptest.Parallel(t, cfg, n, backend, naive.build) {
					for _, e := range spans(res.Trace, "all_reduce ") {
						for _, b := range named(res.Trace, "backward") {
							require.False(t, b.TS <= e.TS && e.TS <= end(b), "rank %d: naive %s issued during backward", r, e.Name)
						}
					}
				}
			})
		}
	}
}

// withheld bounds how long a gated collective waits for the computation it
// should overlap; only an implementation that waits for the collective
// first ever reaches it.
const withheld = 10 * time.Second

// backwardGate holds the gate of one rank: armed before each micro-batch's
// forward, opened when its backward is over (PostGrad runs before DDP's
// PreStep waits for the buckets). held[i] is how many all-reduces the i-th
// backward ended with, all of them still withheld.
type backwardGate struct {
	gate *commtest.Gate
	ddp  *ddp.DDP
	held []int
}

func (b *backwardGate) Name() string { return "backward-gate" }

func (b *backwardGate) PreForward(*trainer.Trainer, tensor.PassInfo) error {
	b.gate.Arm()
	return nil
}

func (b *backwardGate) PostGrad(*trainer.Trainer, tensor.PassInfo) error {
	b.held = append(b.held, b.gate.Open(true))
	return nil
}

// TestBucketsWithheldUntilBackwardEnds proves the overlap by construction:
// each rank's bucket all-reduces are withheld (commtest.Gate) until its
// backward is over. Bucketed DDP must reach the end of the last
// micro-batch's backward with every bucket issued and none complete; an
// implementation that waits for a bucket before going on with backward
// fails by the gate's deadline.
func TestBucketsWithheldUntilBackwardEnds(t *testing.T) {
	for _, backend := range backends {
		for _, accum := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s/accum%d", backend, accum), func(t *testing.T) {
				const n = 2
				_, cfg := configs(n, accum)
				var mu sync.Mutex
				gates := map[int]*backwardGate{}
				build := ptest.DP(func(g comm.Group) ([]trainer.Plugin, error) {
					gate := &backwardGate{gate: commtest.NewGate(g, withheld, commtest.AllReduce)}
					d, err := ddp.New(gate.gate, manyBuckets.mode, manyBuckets.bucketMB, manyBuckets.firstMB)
					if err != nil {
						return nil, err
					}
					gate.ddp = d
					mu.Lock()
					gates[g.Rank()] = gate
					mu.Unlock()
					return []trainer.Plugin{gate, d}, nil
				})
				ptest.Parallel(t, cfg, n, backend, build)
				for r := 0; r < n; r++ {
					g := gates[r]
					buckets := len(g.ddp.Buckets())
					require.Greater(t, buckets, 2, "rank %d", r)
					require.NoError(t, g.gate.Err(), "rank %d", r)
					require.Len(t, g.held, accum*cfg.Train.Steps, "rank %d", r)
					for i, h := range g.held {
						want := 0
						if i%accum == accum-1 {
							want = buckets // the last micro-batch issues every bucket during its backward
						}
						require.Equal(t, want, h, "rank %d, backward %d: all-reduces withheld when it ended", r, i)
					}
				}
			})
		}
	}
}
