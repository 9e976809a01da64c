package comm

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// expectEq compares exactly: inputs are small integers, so every correct
// reduction order yields the reference bits.
func expectEq(what string, got *tensor.Tensor, want []float64) error {
	if got.Numel() != len(want) {
		return fmt.Errorf("%s: %d elements, want %d", what, got.Numel(), len(want))
	}
	for i, w := range want {
		if g := got.At(i); g != w {
			return fmt.Errorf("%s: element %d = %v, want %v", what, i, g, w)
		}
	}
	return nil
}

// Sizes straddle the direct/ring threshold (8192 float32) and do not divide
// evenly by any world size; 3 is smaller than most worlds (empty blocks).
var testCounts = []int{0, 3, 37, 10007}

// checkAllOps runs every collective on g and compares with the serial
// reference. shift varies the data between calls.
func checkAllOps(g Group, dtypes []tensor.DType) error {
	n, me := g.Size(), g.Rank()
	for _, dt := range dtypes {
		for _, cnt := range testCounts {
			for _, op := range []ReduceOp{Sum, Avg, Max, Min} {
				if op == Avg && dt == tensor.Int32 {
					continue
				}
				x := filled(dt, me, cnt, cnt)
				if err := g.AllReduce(x, op); err != nil {
					return err
				}
				if err := expectEq(fmt.Sprintf("all_reduce %s %s n=%d", op, dt, cnt), x, refReduce(dt, op, n, cnt, cnt)); err != nil {
					return err
				}
			}
			// reduce_scatter: cnt elements per rank.
			in := filled(dt, me, cnt*n, 1)
			inCopy := in.Clone(tensor.Comm)
			out := tensor.Default.New(tensor.Comm, dt, cnt)
			if err := g.ReduceScatter(in, out, Sum); err != nil {
				return err
			}
			full := refReduce(dt, Sum, n, cnt*n, 1)
			if err := expectEq(fmt.Sprintf("reduce_scatter %s n=%d", dt, cnt), out, full[me*cnt:(me+1)*cnt]); err != nil {
				return err
			}
			if err := expectEq("reduce_scatter leaves its input alone", in, inCopy.Float64s()); err != nil {
				return err
			}
			// all_gather.
			ag := tensor.Default.New(tensor.Comm, dt, cnt*n)
			if err := g.AllGather(filled(dt, me, cnt, 2), ag); err != nil {
				return err
			}
			var want []float64
			for r := range n {
				want = append(want, filled(dt, r, cnt, 2).Float64s()...)
			}
			if err := expectEq(fmt.Sprintf("all_gather %s n=%d", dt, cnt), ag, want); err != nil {
				return err
			}
			// all_gather_v with unequal counts (rank 1 sends nothing).
			counts := make([]int, n)
			total := 0
			for r := range counts {
				counts[r] = (cnt*(r+1) + r) % (cnt + 5)
				if r == 1 {
					counts[r] = 0
				}
				total += counts[r]
			}
			agv := tensor.Default.New(tensor.Comm, dt, total)
			if err := g.AllGatherV(filled(dt, me, counts[me], 3), agv, counts); err != nil {
				return err
			}
			want = want[:0]
			for r := range n {
				want = append(want, filled(dt, r, counts[r], 3).Float64s()...)
			}
			if err := expectEq(fmt.Sprintf("all_gather_v %s counts=%v", dt, counts), agv, want); err != nil {
				return err
			}
			// broadcast from the last rank, reduce to the middle one.
			root := n - 1
			b := filled(dt, me, cnt, 4)
			if err := g.Broadcast(b, root); err != nil {
				return err
			}
			if err := expectEq(fmt.Sprintf("broadcast %s n=%d", dt, cnt), b, filled(dt, root, cnt, 4).Float64s()); err != nil {
				return err
			}
			root = n / 2
			rd := filled(dt, me, cnt, 5)
			if err := g.Reduce(rd, root, Max); err != nil {
				return err
			}
			if me == root {
				if err := expectEq(fmt.Sprintf("reduce %s n=%d", dt, cnt), rd, refReduce(dt, Max, n, cnt, 5)); err != nil {
					return err
				}
			}
			if err := g.Barrier(); err != nil {
				return err
			}
		}
	}
	return nil
}

func TestCollectivesEveryWorldSize(t *testing.T) {
	for name, run := range backendRunners {
		for n := 1; n <= 5; n++ {
			t.Run(fmt.Sprintf("%s/n=%d", name, n), func(t *testing.T) {
				t.Parallel()
				// Small chunks make the ring stream every block in pieces.
				opts := Options{ChunkBytes: 4096}
				dtypes := []tensor.DType{tensor.Float32}
				if n == 3 || n == 4 {
					dtypes = append(dtypes, tensor.Float64, tensor.Int32)
					dtypes = append(dtypes, halfDTypes...)
				}
				require.NoError(t, run(t, n, opts, func(g Group) error {
					if g.Size() != n {
						return fmt.Errorf("size %d, want %d", g.Size(), n)
					}
					return checkAllOps(g, dtypes)
				}))
			})
		}
	}
}

func TestSendRecvRing(t *testing.T) {
	for name, run := range backendRunners {
		t.Run(name, func(t *testing.T) {
			const n, cnt = 4, 20000
			require.NoError(t, run(t, n, Options{ChunkBytes: 8192}, func(g Group) error {
				me := g.Rank()
				// Every rank sends first and receives second: eager sends
				// keep this ring from deadlocking.
				for round := range 3 {
					if err := g.Send(filled(tensor.Float32, me, cnt, round), (me+1)%n); err != nil {
						return err
					}
					got := tensor.Default.New(tensor.Comm, tensor.Float32, cnt)
					prev := (me + n - 1) % n
					if err := g.Recv(got, prev); err != nil {
						return err
					}
					if err := expectEq(fmt.Sprintf("round %d from %d", round, prev), got, filled(tensor.Float32, prev, cnt, round).Float64s()); err != nil {
						return err
					}
				}
				return nil
			}))
		})
	}
}

func TestAsyncHandlesWaitedOutOfOrder(t *testing.T) {
	for name, run := range backendRunners {
		t.Run(name, func(t *testing.T) {
			const n = 3
			require.NoError(t, run(t, n, Options{}, func(g Group) error {
				me := g.Rank()
				counts := []int{10, 9000, 33, 20000}
				xs := make([]*tensor.Tensor, len(counts))
				hs := make([]Handle, len(counts))
				for i, c := range counts {
					xs[i] = filled(tensor.Float32, me, c, i)
					hs[i] = g.AllReduceAsync(xs[i], Sum)
				}
				gin := filled(tensor.Float32, me, 500, 9)
				gout := tensor.Default.New(tensor.Comm, tensor.Float32, 500*n)
				hg := g.AllGatherAsync(gin, gout)
				rin := tensor.Default.New(tensor.Comm, tensor.Float32, 7)
				hr := g.RecvAsync(rin, (me+n-1)%n)
				hsend := g.SendAsync(filled(tensor.Float32, me, 7, 0), (me+1)%n)
				for _, h := range []Handle{hr, hg, hs[3], hs[1], hsend, hs[0], hs[2]} {
					if err := h.Wait(); err != nil {
						return err
					}
				}
				for i, c := range counts {
					if err := expectEq(fmt.Sprintf("async %d", i), xs[i], refReduce(tensor.Float32, Sum, n, c, i)); err != nil {
						return err
					}
				}
				var want []float64
				for r := range n {
					want = append(want, filled(tensor.Float32, r, 500, 9).Float64s()...)
				}
				if err := expectEq("async all_gather", gout, want); err != nil {
					return err
				}
				return expectEq("async recv", rin, filled(tensor.Float32, (me+n-1)%n, 7, 0).Float64s())
			}))
		})
	}
}

func TestSubGroups(t *testing.T) {
	for name, run := range backendRunners {
		t.Run(name, func(t *testing.T) {
			const n = 5
			require.NoError(t, run(t, n, Options{}, func(g Group) error {
				me := g.Rank()
				// Every rank creates both groups, in the same order.
				even, err := g.NewNamedGroup("even", []int{0, 2, 4})
				if err != nil {
					return err
				}
				odd, err := g.NewGroup([]int{3, 1}) // group rank follows list order
				if err != nil {
					return err
				}
				mine, other := even, odd
				members := []int{0, 2, 4}
				if me%2 == 1 {
					mine, other = odd, even
					members = []int{3, 1}
				}
				if other != nil {
					return fmt.Errorf("rank %d got a group it is not in", me)
				}
				if mine.Size() != len(members) || mine.WorldRank(mine.Rank()) != me {
					return fmt.Errorf("rank %d: group size %d rank %d", me, mine.Size(), mine.Rank())
				}
				// Interleave world and sub-group traffic on shared connections.
				x := tensor.Default.New(tensor.Comm, tensor.Float32, 9000)
				for i := range 9000 {
					x.Set(i, float64(me*10+i%3))
				}
				h := mine.AllReduceAsync(x, Sum)
				w := filled(tensor.Float32, me, 100, 0)
				if err := g.AllReduce(w, Sum); err != nil {
					return err
				}
				if err := h.Wait(); err != nil {
					return err
				}
				for i := range 9000 {
					want := 0.0
					for _, m := range members {
						want += float64(m*10 + i%3)
					}
					if x.At(i) != want {
						return fmt.Errorf("rank %d sub-group element %d = %v, want %v", me, i, x.At(i), want)
					}
				}
				if err := expectEq("world", w, refReduce(tensor.Float32, Sum, n, 100, 0)); err != nil {
					return err
				}
				// A sub-group of a sub-group, and its broadcast.
				if me%2 == 0 {
					pair, err := mine.NewGroup([]int{2, 0}) // world ranks 4 and 0
					if err != nil {
						return err
					}
					if me == 2 {
						if pair != nil {
							return fmt.Errorf("rank 2 is not in the pair")
						}
						return nil
					}
					b := tensor.FromF32([]float32{float32(me)}, 1)
					if err := pair.Broadcast(b, 0); err != nil {
						return err
					}
					if b.F32()[0] != 4 {
						return fmt.Errorf("rank %d: pair broadcast got %v, want 4", me, b.F32()[0])
					}
				}
				return nil
			}))
		})
	}
}

func TestInvalidCallsFailWithoutUsingASequenceNumber(t *testing.T) {
	require.NoError(t, RunLocal(2, Options{}, func(g Group) error {
		in := tensor.Default.New(tensor.Comm, tensor.Float32, 5)
		out := tensor.Default.New(tensor.Comm, tensor.Float32, 3)
		err := g.ReduceScatter(in, out, Sum)
		want := `comm: reduce_scatter on group "world": input has 5 elements, want group size 2 × output 3 = 6`
		if err == nil || err.Error() != want {
			return fmt.Errorf("got %v, want %s", err, want)
		}
		err = g.AllReduce(tensor.Default.New(tensor.Comm, tensor.Int32, 2), Avg)
		if err == nil || err.Error() != `comm: all_reduce on group "world": avg needs a float dtype, got int32 (use sum and divide)` {
			return fmt.Errorf("got %v", err)
		}
		if _, err := g.NewGroup([]int{0, 0}); err == nil {
			return fmt.Errorf("duplicate ranks accepted")
		}
		// The group still works, at seq 1.
		return g.Barrier()
	}))
}

// Groups count the payload this rank sends: a ring all-reduce of n bytes
// over N ranks sends 2(N-1)/N·n, a ring reduce-scatter or all-gather
// (N-1)/N of the whole buffer, a direct all-reduce (small buffers)
// (N-1)·n; a sub-group's sends count on it and on the rank's total.
// Through a shared-memory segment (tcp, one host) a rank counts the bytes
// of its data that the others read, which are the same amounts.
func TestGroupsCountSentBytes(t *testing.T) {
	for name, run := range backendRunners {
		t.Run(name, func(t *testing.T) { checkSentBytes(t, run) })
	}
}

func checkSentBytes(t *testing.T, run runner) {
	const N, big, small = 4, 1 << 16, 64 // float32 elements: 256 KiB (ring) and 256 B (direct)
	require.NoError(t, run(t, N, Options{}, func(g Group) error {
		c := g.(ByteCounter)
		check := func(what string, want int64, f func() error) error {
			before := c.SentBytes()
			if err := f(); err != nil {
				return err
			}
			if got := c.SentBytes() - before; got != want {
				return fmt.Errorf("rank %d: %s sent %d bytes, want %d", g.Rank(), what, got, want)
			}
			return nil
		}
		a := tensor.Default.New(tensor.Comm, tensor.Float32, big)
		if err := check("ring all-reduce", 2*(N-1)*4*big/N, func() error { return g.AllReduce(a, Sum) }); err != nil {
			return err
		}
		out := tensor.Default.New(tensor.Comm, tensor.Float32, big/N)
		if err := check("ring reduce-scatter", (N-1)*4*big/N, func() error { return g.ReduceScatter(a, out, Sum) }); err != nil {
			return err
		}
		if err := check("ring all-gather", (N-1)*4*big/N, func() error { return g.AllGather(out, a) }); err != nil {
			return err
		}
		s := tensor.Default.New(tensor.Comm, tensor.Float32, small)
		if err := check("direct all-reduce", (N-1)*4*small, func() error { return g.AllReduce(s, Sum) }); err != nil {
			return err
		}
		pair, err := g.NewGroup([]int{g.Rank() / 2 * 2, g.Rank()/2*2 + 1})
		if err != nil {
			return err
		}
		total := c.RankSentBytes()
		if err := pair.AllReduce(s, Sum); err != nil {
			return err
		}
		if got, want := pair.(ByteCounter).SentBytes(), int64(4*small); got != want {
			return fmt.Errorf("rank %d: the pair group sent %d bytes, want %d", g.Rank(), got, want)
		}
		if got := c.RankSentBytes() - total; got != 4*small {
			return fmt.Errorf("rank %d: the rank's total grew by %d, want %d", g.Rank(), got, 4*small)
		}
		return nil
	}))
}
