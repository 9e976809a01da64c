package pp_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trace"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// gradLog writes a "grad ready" event into the rank's trace each time a
// parameter's gradient for a micro-batch becomes final. Spans are recorded
// as they end, so in the event list such an event comes before the end of
// the executor's action (F, B or W span) that computed the gradient.
type gradLog struct{}

func (gradLog) Name() string { return "grad-log" }

func (gradLog) GradReady(t *trainer.Trainer, p *tensor.Tensor, info tensor.PassInfo) error {
	t.Trace.Begin("grad ready", "test", trace.Compute).With("param", p.Name).With("micro", info.Micro).End()
	return nil
}

// deferred reports whether zb1 computes p's gradient in the W action: the
// weights and biases of the linear layers. Layer norms and the position
// embedding get theirs in B; the tied wte is finished by the pipeline
// after the schedule.
func deferred(name string) (weight, known bool) {
	switch {
	case strings.Contains(name, ".c_"):
		return true, true
	case strings.Contains(name, "ln_"), strings.HasPrefix(name, "wpe"):
		return false, true
	}
	return false, false
}

// TestZB1SplitsBackward reads, from each rank's trace, which action made
// each gradient final: under zb1 every linear layer's gradient of
// micro-batch m comes from its own W action, the layer norms' from B, and
// on rank r (which holds r weight-gradient passes back) the W of m runs
// after the B of micro-batch m+r. A fused backward (weights computed in B)
// fails it.
func TestZB1SplitsBackward(t *testing.T) {
	for _, p := range []int{2, 3} {
		t.Run(fmt.Sprintf("pp%d", p), func(t *testing.T) {
			const m = 4
			cfg := base(2*p, m)
			cfg.Train.Steps = 1
			cfg.Parallel.PP, cfg.PP.Schedule = p, "zb1"
			got := ptest.Parallel(t, cfg, p, "local", func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) {
				ps, ms, err := plugins.Build(cfg, g)
				return append(ps, gradLog{}), ms, err
			})
			for r, res := range got {
				type fire struct {
					index  int
					weight bool
				}
				fires := map[int][]fire{} // by micro-batch
				var pending []trace.Event
				for i, e := range res.Trace {
					if e.Cat == "test" {
						pending = append(pending, e)
						continue
					}
					if e.Cat != "pp" {
						continue
					}
					for _, g := range pending {
						name, micro := g.Args["param"].(string), g.Args["micro"].(int)
						weight, known := deferred(name)
						if !known {
							continue
						}
						want := "B"
						if weight {
							want = "W"
						}
						require.Equal(t, fmt.Sprintf("%s micro %d", want, micro), fmt.Sprintf("%s micro %d", e.Name, e.Args["micro"]),
							"rank %d: the action that made %s's gradient of micro-batch %d final", r, name, micro)
						fires[micro] = append(fires[micro], fire{i, weight})
					}
					pending = nil
				}
				for mb := 0; mb < m; mb++ {
					lastB, firstW := -1, len(res.Trace)
					for _, f := range fires[mb] {
						if f.weight {
							firstW = min(firstW, f.index)
						}
					}
					for _, f := range fires[min(mb+r, m-1)] {
						if !f.weight {
							lastB = max(lastB, f.index)
						}
					}
					require.Less(t, firstW, len(res.Trace), "rank %d: no weight gradient of micro-batch %d", r, mb)
					require.GreaterOrEqual(t, lastB, 0, "rank %d: no input-pass gradient of micro-batch %d", r, min(mb+r, m-1))
					require.Greater(t, firstW, lastB, "rank %d: micro-batch %d's W runs after the B of micro-batch %d", r, mb, min(mb+r, m-1))
				}
			}
		})
	}
}
