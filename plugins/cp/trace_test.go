package cp

import (
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trace"
)

// The ring issues each step's transfer before it computes that step's
// block, so the trace shows every forward kv transfer opening no later
// than the block it overlaps, and the backward's accumulator receives
// opening before the block whose gradient they carry is computed. Only
// the order of events is checked, never a duration.
func TestRingTraceIssuesTransfersBeforeCompute(t *testing.T) {
	const n, T = 3, 12
	pos, err := AllPositions(Zigzag, T, n)
	require.NoError(t, err)
	recs := make([]*trace.Recorder, n)
	var mu sync.Mutex
	require.NoError(t, comm.RunLocal(n, comm.Options{Timeout: 30 * time.Second}, func(g comm.Group) error {
		rec := trace.New(g.Rank())
		a := &Attention{NHead: 2, G: g, Pos: pos, Ring: true, Trace: rec}
		x := rows(randF32(newRand(1), 2, T, 24), pos[g.Rank()]).RequiresGrad()
		out, err := a.Forward(x, nn.Pass{})
		if err != nil {
			return err
		}
		if _, err := tensor.Backward(tensor.Sum(out), nil, tensor.BackwardOptions{}); err != nil {
			return err
		}
		mu.Lock()
		recs[g.Rank()] = rec
		mu.Unlock()
		return nil
	}))
	for r, rec := range recs {
		type key struct {
			name string
			step int
		}
		first := map[key]trace.Event{}
		count := map[string]int{}
		for _, e := range rec.Events() {
			k := key{e.Name, int(e.Args["step"].(int))}
			if f, ok := first[k]; !ok || e.TS < f.TS {
				first[k] = e // spans are recorded as they end: keep the earliest opened
			}
			count[e.Name]++
		}
		// Forward: n blocks, n-1 transfers; backward: n blocks, n-1 kv
		// transfers again, n-1 accumulator receives during the ring, n
		// accumulator sends and the final receive.
		require.Equal(t, 2*n, count["cp block"]+count["cp block backward"], "rank %d", r)
		require.Equal(t, 2*(n-1), count["cp kv"], "rank %d", r)
		require.Equal(t, (n-1)+n+1, count["cp dkv"], "rank %d", r)
		for s := 0; s < n; s++ {
			if s < n-1 {
				kv, blk := first[key{"cp kv", s}], first[key{"cp block", s}]
				require.LessOrEqual(t, kv.TS, blk.TS, "rank %d: forward step %d's transfer opens before its block", r, s)
			}
			if s > 0 {
				acc, blk := first[key{"cp dkv", s}], first[key{"cp block backward", s}]
				require.LessOrEqual(t, acc.TS, blk.TS, "rank %d: backward step %d's accumulator receive opens before its block", r, s)
			}
		}
	}
}

func newRand(seed int64) *rand.Rand { return rand.New(rand.NewSource(seed)) }
