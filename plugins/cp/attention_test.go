package cp

import (
	"fmt"
	"math"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// Ring and all-gather attention on goroutine ranks hold the rows they
// compute, and the gradient of every row of q, k and v, to whole-sequence
// causal attention (tensor.SelfAttention) in float32, 1e-6 norm-wise.
// Under the contiguous split with cp >= 3 a middle rank's queries see an
// earlier block whole, their own block partly (the diagonal) and a later
// block not at all (skipped); under zigzag every rank sees every block at
// least partly.

// rows copies the rows at positions pos of dimension 1 of a [B, T, X]
// float32 tensor.
func rows(t *tensor.Tensor, pos []int) *tensor.Tensor {
	B, T, X := t.Dim(0), t.Dim(1), t.Dim(2)
	out := tensor.New(tensor.Float32, B, len(pos), X)
	for b := 0; b < B; b++ {
		for i, p := range pos {
			copy(out.F32()[(b*len(pos)+i)*X:(b*len(pos)+i+1)*X], t.F32()[(b*T+p)*X:(b*T+p+1)*X])
		}
	}
	return out
}

func randF32(r *rand.Rand, shape ...int) *tensor.Tensor {
	t := tensor.New(tensor.Float32, shape...)
	for i := range t.F32() {
		t.F32()[i] = float32(r.NormFloat64())
	}
	return t
}

// relDiff is ‖a - b‖ / ‖b‖.
func relDiff(a, b []float32) float64 {
	var d, n float64
	for i := range a {
		d += (float64(a[i]) - float64(b[i])) * (float64(a[i]) - float64(b[i]))
		n += float64(b[i]) * float64(b[i])
	}
	return math.Sqrt(d / n)
}

func TestAttentionMatchesWholeSequence(t *testing.T) {
	const B, NH, C = 2, 2, 8
	for _, tc := range []struct {
		n     int
		split string
		T     int
	}{
		{2, Zigzag, 8}, {2, Zigzag, 20}, {2, Contiguous, 10},
		{3, Zigzag, 12}, {3, Contiguous, 9}, {3, Contiguous, 15},
		{4, Zigzag, 16}, {4, Contiguous, 8}, {4, Contiguous, 12},
	} {
		for _, ring := range []bool{true, false} {
			t.Run(fmt.Sprintf("cp%d_%s_T%d_ring=%v", tc.n, tc.split, tc.T, ring), func(t *testing.T) {
				rng := rand.New(rand.NewSource(int64(tc.T*10 + tc.n)))
				qkv := randF32(rng, B, tc.T, 3*C)
				w := randF32(rng, B, tc.T, C)
				whole := tensor.New(tensor.Float32, qkv.Shape()...)
				whole.CopyFrom(qkv)
				whole.RequiresGrad()
				want, lse := tensor.SelfAttention(whole, NH, nil)
				lse.Release()
				_, err := tensor.Backward(tensor.Sum(tensor.Mul(want, w)), nil, tensor.BackwardOptions{})
				require.NoError(t, err)

				pos, err := AllPositions(tc.split, tc.T, tc.n)
				require.NoError(t, err)
				type result struct{ out, grad *tensor.Tensor }
				got := make([]result, tc.n)
				var mu sync.Mutex
				stats := &Stats{}
				require.NoError(t, comm.RunLocal(tc.n, comm.Options{Timeout: 30 * time.Second}, func(g comm.Group) error {
					r := g.Rank()
					x := rows(qkv, pos[r]).RequiresGrad()
					a := &Attention{NHead: NH, G: g, Pos: pos, Ring: ring, Stats: stats}
					out, err := a.Forward(x, nnPass())
					if err != nil {
						return err
					}
					if _, err := tensor.Backward(tensor.Sum(tensor.Mul(out, rows(w, pos[r]))), nil, tensor.BackwardOptions{}); err != nil {
						return err
					}
					mu.Lock()
					got[r] = result{out, x.Grad}
					mu.Unlock()
					return nil
				}))
				for r := range got {
					require.Less(t, relDiff(got[r].out.F32(), rows(want, pos[r]).F32()), 1e-6, "rank %d output", r)
					require.Less(t, relDiff(got[r].grad.F32(), rows(whole.Grad, pos[r]).F32()), 1e-6, "rank %d gradient of q, k, v", r)
				}
				// Every visible pair computed once, none twice.
				require.Equal(t, int64(B*tc.T*(tc.T+1)/2), stats.Pairs.Load())
				wantSkips := 0
				if tc.split == Contiguous {
					wantSkips = tc.n * (tc.n - 1) / 2
				}
				require.Equal(t, int64(wantSkips), stats.Skipped.Load())
			})
		}
	}
}

func TestPositions(t *testing.T) {
	p, err := AllPositions(Zigzag, 8, 2)
	require.NoError(t, err)
	require.Equal(t, [][]int{{0, 1, 6, 7}, {2, 3, 4, 5}}, p)
	p, err = AllPositions(Contiguous, 6, 3)
	require.NoError(t, err)
	require.Equal(t, [][]int{{0, 1}, {2, 3}, {4, 5}}, p)
	_, err = Positions(Zigzag, 12, 4, 0)
	require.EqualError(t, err, "cp: block_size 12 does not split into 8 equal chunks (cp.split=zigzag over 4 ranks); choose block_size a multiple of 8")
}

// Zigzag balances the causal work: every rank's queries see the same
// number of keys, where the contiguous split gives the last rank 2n-1
// times the first's.
func TestZigzagBalance(t *testing.T) {
	const T, n = 64, 4
	for _, tc := range []struct {
		split    string
		min, max int64
	}{{Zigzag, 520, 520}, {Contiguous, 136, 904}} {
		pos, err := AllPositions(tc.split, T, n)
		require.NoError(t, err)
		lo, hi := int64(math.MaxInt64), int64(0)
		for r := range pos {
			var s int64
			for j := range pos {
				s += Pairs(pos[r], pos[j])
			}
			lo, hi = min(lo, s), max(hi, s)
		}
		require.Equal(t, tc.min, lo, tc.split)
		require.Equal(t, tc.max, hi, tc.split)
	}
}

func nnPass() nn.Pass { return nn.Pass{} }

// A layer given rows other than its own says which rank and how many.
func TestAttentionRefusesOtherRows(t *testing.T) {
	pos, err := AllPositions(Zigzag, 8, 2)
	require.NoError(t, err)
	require.NoError(t, comm.RunLocal(2, comm.Options{Timeout: 5 * time.Second}, func(g comm.Group) error {
		a := &Attention{NHead: 2, G: g, Pos: pos, Ring: true}
		_, err := a.Forward(tensor.New(tensor.Float32, 1, 8, 24), nn.Pass{})
		require.EqualError(t, err, fmt.Sprintf("cp: rank %d's attention got 8 rows of each sequence; it holds 4 (positions %v)", g.Rank(), pos[g.Rank()]))
		e := &Embedding{Pos: pos[g.Rank()]}
		_, err = e.Forward(tensor.New(tensor.Int32, 1, 8), nn.Pass{})
		require.EqualError(t, err, fmt.Sprintf("cp: the embedding got 8 tokens of each sequence; this rank holds 4 (positions %d..%d of its chunks): context parallel runs on whole block_size windows", pos[g.Rank()][0], pos[g.Rank()][3]))
		return nil
	}))
}

// A ring whose peer never joins fails within the deadline, naming the
// rank, the group, the step and the transfer.
func TestRingPeerMissing(t *testing.T) {
	pos, err := AllPositions(Zigzag, 8, 2)
	require.NoError(t, err)
	var got error
	_ = comm.RunLocal(2, comm.Options{Timeout: 300 * time.Millisecond}, func(g comm.Group) error {
		if g.Rank() == 1 {
			return nil
		}
		a := &Attention{NHead: 2, G: g, Pos: pos, Ring: true}
		_, got = a.Forward(randF32(rand.New(rand.NewSource(1)), 1, 4, 24), nn.Pass{})
		return got
	})
	require.Error(t, got)
	want := fmt.Sprintf("cp: rank 0 of group %s: ring forward step 0: send keys and values to rank 1, receive from rank 1: ", "world")
	require.Equal(t, want, got.Error()[:min(len(want), len(got.Error()))], "%v", got)
}
