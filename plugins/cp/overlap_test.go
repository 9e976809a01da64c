package cp

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/comm/commtest"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// TestRingComputesWhileTransfersAreWithheld proves the ring's overlap by
// construction: every send and receive is withheld (commtest.Gate) until
// the rank has computed the block after which it was issued, so each step
// must compute its block while the next block's keys and values (and, in
// backward, the gradient accumulators) are still in flight. A ring that
// waits for a transfer before computing fails by the gate's deadline. The
// zigzag split gives every rank a block to compute at every step.
func TestRingComputesWhileTransfersAreWithheld(t *testing.T) {
	for _, tc := range []struct{ n, T int }{{2, 8}, {3, 12}, {4, 16}} {
		t.Run(fmt.Sprintf("cp%d", tc.n), func(t *testing.T) {
			n := tc.n
			pos, err := AllPositions(Zigzag, tc.T, n)
			require.NoError(t, err)
			type key struct {
				what string
				step int
			}
			released := make([]map[key]int, n)
			gates := make([]*commtest.Gate, n)
			var mu sync.Mutex
			require.NoError(t, comm.RunLocal(n, comm.Options{Timeout: 30 * time.Second}, func(g comm.Group) error {
				gate := commtest.NewGate(g, 10*time.Second, commtest.Send, commtest.Recv)
				got := map[key]int{}
				a := &Attention{NHead: 2, G: gate, Pos: pos, Ring: true}
				a.computed = func(what string, step int) {
					// After the backward's last block only the final
					// accumulator moves, with nothing left to overlap.
					got[key{what, step}] += gate.Open(what == "block backward" && step == n-1)
				}
				gate.Arm()
				x := rows(randF32(newRand(1), 2, tc.T, 24), pos[g.Rank()]).RequiresGrad()
				out, err := a.Forward(x, nn.Pass{})
				if err != nil {
					return err
				}
				if _, err := tensor.Backward(tensor.Sum(out), nil, tensor.BackwardOptions{}); err != nil {
					return err
				}
				mu.Lock()
				released[g.Rank()], gates[g.Rank()] = got, gate
				mu.Unlock()
				return nil
			}))
			for r := 0; r < n; r++ {
				require.NoError(t, gates[r].Err(), "rank %d", r)
				for s := 0; s < n; s++ {
					// Forward step s sends this block and receives the
					// next (none after the last).
					fwd := 0
					if s < n-1 {
						fwd = 2
					}
					// Backward step s: the accumulator's receive and the
					// previous step's send of it (from step 1), the
					// keys and values' send and receive (to step n-2).
					bwd := 0
					if s > 0 {
						bwd += 2
					}
					if s < n-1 {
						bwd += 2
					}
					require.Equal(t, fwd, released[r][key{"block", s}], "rank %d: transfers withheld while forward block %d computed", r, s)
					require.Equal(t, bwd, released[r][key{"block backward", s}], "rank %d: transfers withheld while backward block %d computed", r, s)
				}
			}
		})
	}
}
