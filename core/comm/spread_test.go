//go:build linux

package comm

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// spreadOf is g's layout over hosts: the group ranks of each host, and how
// many members this rank's host segment has (0: none).
func spreadOf(g Group) ([][]int, int) {
	sp := g.(*group).spread
	if sp == nil {
		return nil, 0
	}
	if sp.seg == nil {
		return sp.hosts, 0
	}
	return sp.hosts, sp.seg.n
}

// Groups over several "hosts" (told apart by their host identity) reduce
// within each host through its segment, across hosts between leaders, and
// within again: every collective, every dtype, sizes from none to several
// rounds of the segment, hosts of contiguous ranks and interleaved ones and
// a host with a single rank, against the serial reference (inputs that add
// exactly, so every path gives these bits), with each layout seen in place.
func TestSpreadCollectivesMatchReference(t *testing.T) {
	t.Setenv("TINYACC_SHM", "1")
	for _, hosts := range [][]string{
		{"A", "A", "B", "B"},
		{"A", "B", "A", "B"},
		{"A", "A", "A", "B"},
	} {
		t.Run(fmt.Sprint(hosts), func(t *testing.T) {
			err := runTCPLocalHosts(len(hosts), hosts, Options{ChunkBytes: 8 << 10}, func(g Group) error {
				if err := checkAllOps(g, []tensor.DType{tensor.Float32, tensor.Float64, tensor.Int32, tensor.BFloat16, tensor.Float16}); err != nil {
					return err
				}
				layout, members := spreadOf(g)
				var want [][]int
				for r, h := range hosts {
					i := slices.Index(hosts, h)
					if i == r {
						want = append(want, []int{r})
					} else {
						for k := range want {
							if want[k][0] == i {
								want[k] = append(want[k], r)
							}
						}
					}
				}
				onMine := 0
				for _, h := range hosts {
					if h == hosts[g.Rank()] {
						onMine++
					}
				}
				if onMine == 1 {
					onMine = 0
				}
				if fmt.Sprint(layout) != fmt.Sprint(want) || members != onMine {
					return fmt.Errorf("hosts %v, segment of %d, want %v and %d", layout, members, want, onMine)
				}
				return nil
			})
			require.NoError(t, err)
		})
	}
}

// The mixed layout gives exactly the one-host results: two hosts of two
// ranks against four ranks on one host, every collective at a size of many
// segment rounds.
func TestSpreadMatchesOneHost(t *testing.T) {
	t.Setenv("TINYACC_SHM", "1")
	const cnt = 300_007
	run := func(hosts []string) [][]float64 {
		res := make([][]float64, 4)
		var mu sync.Mutex
		require.NoError(t, runTCPLocalHosts(4, hosts, Options{ChunkBytes: 8 << 10}, func(g Group) error {
			me := g.Rank()
			var got []float64
			ar := filled(tensor.Float32, me, cnt, 0)
			if err := g.AllReduce(ar, Avg); err != nil {
				return err
			}
			got = append(got, ar.Float64s()...)
			out := tensor.Default.New(tensor.Comm, tensor.Float32, cnt)
			if err := g.ReduceScatter(filled(tensor.Float32, me, 4*cnt, 1), out, Sum); err != nil {
				return err
			}
			got = append(got, out.Float64s()...)
			ag := tensor.Default.New(tensor.Comm, tensor.Float32, 4*cnt)
			if err := g.AllGather(filled(tensor.Float32, me, cnt, 2), ag); err != nil {
				return err
			}
			got = append(got, ag.Float64s()...)
			b := filled(tensor.Float32, me, cnt, 3)
			if err := g.Broadcast(b, 1); err != nil {
				return err
			}
			got = append(got, b.Float64s()...)
			rd := filled(tensor.Float32, me, cnt, 4)
			if err := g.Reduce(rd, 2, Min); err != nil {
				return err
			}
			got = append(got, rd.Float64s()...)
			if (hosts == nil) != (g.(*group).spread == nil) {
				return fmt.Errorf("hosts %v: spread over hosts %v", hosts, g.(*group).spread != nil)
			}
			mu.Lock()
			res[me] = got
			mu.Unlock()
			return nil
		}))
		return res
	}
	one := run(nil)
	two := run([]string{"A", "A", "B", "B"})
	for r := range one {
		require.Equal(t, len(one[r]), len(two[r]))
		for i := range one[r] {
			if one[r][i] != two[r][i] {
				t.Fatalf("rank %d element %d: one host %v, two hosts %v", r, i, one[r][i], two[r][i])
			}
		}
	}
}

// hostOrderSum is ((x0 + x1) + (x2 + x3)) of the ranks' noisy inputs in
// float32: each host's ranks in rank order, then the hosts in order.
func hostOrderSum(cnt int) []float64 {
	x := make([][]float32, 4)
	for r := range x {
		x[r] = noisy(tensor.Float32, r, cnt).F32()
	}
	out := make([]float64, cnt)
	for i := range out {
		out[i] = float64((x[0][i] + x[1][i]) + (x[2][i] + x[3][i]))
	}
	return out
}

// Sums of values that round follow the stated order, bitwise, on every
// rank and in repeated jobs, at one round and at many.
func TestSpreadSumsFollowTheHostOrder(t *testing.T) {
	t.Setenv("TINYACC_SHM", "1")
	for _, cnt := range []int{1001, 200_003} {
		want := hostOrderSum(cnt)
		for run := 0; run < 2; run++ {
			require.NoError(t, runTCPLocalHosts(4, []string{"A", "A", "B", "B"}, Options{ChunkBytes: 8 << 10}, func(g Group) error {
				x := noisy(tensor.Float32, g.Rank(), cnt)
				if err := g.AllReduce(x, Sum); err != nil {
					return err
				}
				got := x.Float64s()
				for i := range want {
					if math.Float64bits(got[i]) != math.Float64bits(want[i]) {
						return fmt.Errorf("run %d n=%d element %d: %v, want %v", run, cnt, i, got[i], want[i])
					}
				}
				return nil
			}))
		}
	}
}

// A rank that never calls the collective, on the second host: every other
// rank, whether it waits on the segment or on the other host's leader,
// fails by its deadline naming it. The first to time out reports the
// deadline; one woken by that rank's verdict reports the time it had waited.
func TestSpreadRankNotArriving(t *testing.T) {
	t.Setenv("TINYACC_SHM", "1")
	others := make(chan struct{}, 3)
	err := runTCPLocalHosts(4, []string{"A", "A", "B", "B"}, Options{Timeout: time.Second, ChunkBytes: 8 << 10}, func(g Group) error {
		if err := g.AllReduce(filled(tensor.Float32, g.Rank(), 10, 0), Sum); err != nil {
			return err
		}
		if g.Rank() == 3 {
			for range 3 {
				<-others
			}
			return nil
		}
		err := g.AllReduce(filled(tensor.Float32, g.Rank(), 100_000, 0), Sum)
		others <- struct{}{}
		return err
	})
	errs := rankErrors(err)
	require.Len(t, errs, 3, "%v", err)
	for _, r := range []int{0, 1, 2} {
		assert.Regexp(t, fmt.Sprintf(`^rank %d: comm: all_reduce on group "world" seq 2 failed after (1s|\d+ms): ranks \[3\] did not arrive \(rank 3: last started seq 1\)$`, r), errs[r])
	}
}
