package ep

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// The exchange at 3 ranks with uneven and zero counts: rank p sends
// send[p][q] rows to rank q, row values naming (sender, receiver, index),
// so every received row is checked exactly; the backward, fed the
// received rows' own values as gradient, returns each sent row to its
// sender unchanged. The counts all-to-all hands every rank what the others
// have for its experts (2 experts per rank).
func TestExchangeExact(t *testing.T) {
	const C = 2
	send := [][]int{{1, 0, 2}, {3, 0, 0}, {0, 0, 1}} // rank 1 receives none
	val := func(p, q, i, c int) float64 { return float64(100*p + 10*q + i + c*1000) }
	var mu sync.Mutex
	got := map[int][]float64{}
	grads := map[int][]float64{}
	counts := map[int][]int{}
	err := comm.RunLocal(3, comm.Options{}, func(g comm.Group) error {
		p := g.Rank()
		x := &exchanger{g: g, alloc: tensor.Default}
		rows := []float64{}
		for q, n := range send[p] {
			for i := 0; i < n; i++ {
				for c := 0; c < C; c++ {
					rows = append(rows, val(p, q, i, c))
				}
			}
		}
		recv := []int{send[0][p], send[1][p], send[2][p]}
		in := tensor.FromF64(rows, len(rows)/C, C).RequiresGrad()
		out, err := x.Exchange(in, send[p], recv)
		if err != nil {
			return err
		}
		if _, err := tensor.Backward(out, out.Detach(), tensor.BackwardOptions{}); err != nil {
			return err
		}
		cnt := make([]int, 6)
		for e := range cnt {
			cnt[e] = 10*p + e
		}
		rc, err := x.Counts(cnt)
		if err != nil {
			return err
		}
		mu.Lock()
		got[p], grads[p], counts[p] = out.F64(), in.Grad.F64(), rc
		mu.Unlock()
		if !assert.Equal(t, rows, in.Grad.F64(), "rank %d: the backward returns its rows", p) {
			return fmt.Errorf("rank %d", p)
		}
		return nil
	})
	require.NoError(t, err)
	for q := 0; q < 3; q++ {
		want := []float64{}
		for p := 0; p < 3; p++ {
			for i := 0; i < send[p][q]; i++ {
				for c := 0; c < C; c++ {
					want = append(want, val(p, q, i, c))
				}
			}
		}
		assert.Equal(t, want, got[q], "rank %d receives", q)
		assert.Equal(t, []int{2 * q, 2*q + 1, 10 + 2*q, 10 + 2*q + 1, 20 + 2*q, 20 + 2*q + 1}, counts[q], "rank %d counts", q)
	}
}
