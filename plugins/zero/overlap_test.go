package zero

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/comm/commtest"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// withheld bounds how long a gated reduce-scatter waits for the backward
// it should overlap; only an implementation that waits for it first ever
// reaches it.
const withheld = 10 * time.Second

// gradGate holds one rank's gate, listed before the ZeRO plugin: armed
// before each forward, opened each time backward makes another gradient
// final (before ZeRO hears of it) and when backward is over. released
// sums what each backward's opens let through; atEnd is what was still
// withheld when it ended.
type gradGate struct {
	gate            *commtest.Gate
	z               *Zero
	released, atEnd []int
}

func (g *gradGate) Name() string { return "grad-gate" }

func (g *gradGate) PreForward(*trainer.Trainer, tensor.PassInfo) error {
	g.gate.Arm()
	g.released = append(g.released, 0)
	return nil
}

func (g *gradGate) GradReady(*trainer.Trainer, *tensor.Tensor, tensor.PassInfo) error {
	g.released[len(g.released)-1] += g.gate.Open(false)
	return nil
}

func (g *gradGate) PostGrad(*trainer.Trainer, tensor.PassInfo) error {
	n := g.gate.Open(true)
	g.released[len(g.released)-1] += n
	g.atEnd = append(g.atEnd, n)
	return nil
}

// TestReduceScatterOverlapsBackward proves stages 2 and 3 overlap their
// gradient reduce-scatters with backward by construction: each rank's
// reduce-scatters are withheld (commtest.Gate) until backward has made a
// further gradient final, or has ended. A unit's reduce-scatter is in
// flight while the next unit's gradients are computed (at most one stays
// in flight, which bounds the full gradient buffers to two units), and
// the last unit's is still in flight when backward ends. An
// implementation that waits for a unit's reduce-scatter before backward
// goes on fails by the gate's deadline.
func TestReduceScatterOverlapsBackward(t *testing.T) {
	for _, stage := range []int{2, 3} {
		for _, accum := range []int{1, 2} {
			t.Run(fmt.Sprintf("stage%d/accum%d", stage, accum), func(t *testing.T) {
				const n = 2
				var mu sync.Mutex
				gates := map[int]*gradGate{}
				build := ptest.DP(func(g comm.Group) ([]trainer.Plugin, error) {
					gate := &gradGate{gate: commtest.NewGate(g, withheld, commtest.ReduceScatter)}
					z, err := New(gate.gate, stage)
					if err != nil {
						return nil, err
					}
					gate.z = z
					mu.Lock()
					gates[g.Rank()] = gate
					mu.Unlock()
					return []trainer.Plugin{gate, z}, nil
				})
				cfg := parallelConfig(stage, n, accum)
				ptest.Parallel(t, cfg, n, "local", build)
				for r := 0; r < n; r++ {
					g := gates[r]
					units := len(g.z.units)
					require.Greater(t, units, 2, "rank %d", r)
					require.NoError(t, g.gate.Err(), "rank %d", r)
					require.Len(t, g.atEnd, accum*cfg.Train.Steps, "rank %d", r)
					for i := range g.atEnd {
						require.Equal(t, units, g.released[i], "rank %d, backward %d: reduce-scatters withheld", r, i)
						require.Equal(t, 1, g.atEnd[i], "rank %d, backward %d: reduce-scatters still withheld when it ended", r, i)
					}
				}
			})
		}
	}
}
