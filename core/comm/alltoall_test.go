package comm

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// a2aVal is element i of the block rank from sends rank to: small integers,
// exact in every dtype, different for every pair and position, so a block
// delivered to the wrong place or at the wrong offset is seen.
func a2aVal(from, to, i int) float64 { return float64(from*100000 + to*10000 + i%9973) }

// a2aCount is how many elements rank from sends rank to in the uneven
// exchange around base: sizes differ pair by pair, and every rank sends
// nothing to the next one.
func a2aCount(from, to, n, base int) int {
	if to == (from+1)%n {
		return 0
	}
	return (base*(from+1) + 7*to + from) % (base + 3)
}

// a2aIn is rank me's input: its block for rank p (counts[p] elements) in
// rank order.
func a2aIn(dt tensor.DType, me int, counts []int) *tensor.Tensor {
	total := 0
	for _, k := range counts {
		total += k
	}
	t := tensor.Default.New(tensor.Comm, dt, total)
	off := 0
	for p, k := range counts {
		for i := range k {
			t.Set(off+i, a2aValIn(dt, me, p, i))
		}
		off += k
	}
	return t
}

// a2aWant is what rank me must hold after the exchange: rank r's block for
// it (counts[r] elements) in rank order.
func a2aWant(me int, counts []int) []float64 {
	var want []float64
	for r, k := range counts {
		for i := range k {
			want = append(want, a2aVal(r, me, i))
		}
	}
	return want
}

// a2aValIn is a2aVal as a tensor of dtype dt holds it: half dtypes hold the
// nearest half of a2aVal/256 (in fp16's range; moving data rounds nothing
// more).
func a2aValIn(dt tensor.DType, from, to, i int) float64 {
	if dt == tensor.BFloat16 || dt == tensor.Float16 {
		return roundHalfRef(dt, a2aVal(from, to, i)/256)
	}
	return a2aVal(from, to, i)
}

// a2aWantIn is a2aWant in dtype dt.
func a2aWantIn(dt tensor.DType, me int, counts []int) []float64 {
	var want []float64
	for r, k := range counts {
		for i := range k {
			want = append(want, a2aValIn(dt, r, me, i))
		}
	}
	return want
}

// a2aBases are the block sizes the checks use: empty, smaller than some
// worlds, around the direct/ring threshold, and several segment rounds.
var a2aBases = []int{0, 3, 37, 10007, 70001}

// checkAllToAll runs AllToAll and AllToAllV on g in every dtype given and
// compares with the expected blocks exactly; it also checks that the
// input is left alone and that the group counts what it sent to others.
func checkAllToAll(g Group, dtypes []tensor.DType) error {
	n, me := g.Size(), g.Rank()
	bc, counting := g.(ByteCounter)
	for _, dt := range dtypes {
		for _, base := range a2aBases {
			equal := make([]int, n)
			for p := range equal {
				equal[p] = base
			}
			in := a2aIn(dt, me, equal)
			out := tensor.Default.New(tensor.Comm, dt, in.Numel())
			if err := g.AllToAll(in, out); err != nil {
				return err
			}
			if err := expectEq(fmt.Sprintf("all_to_all %s block %d", dt, base), out, a2aWantIn(dt, me, equal)); err != nil {
				return err
			}
			if err := expectEq("all_to_all leaves its input alone", in, a2aIn(dt, me, equal).Float64s()); err != nil {
				return err
			}
			send, recv := make([]int, n), make([]int, n)
			sent := 0
			for p := range n {
				send[p], recv[p] = a2aCount(me, p, n, base), a2aCount(p, me, n, base)
				if p != me {
					sent += send[p] * dt.Size()
				}
			}
			in = a2aIn(dt, me, send)
			out = tensor.Default.New(tensor.Comm, dt, len(a2aWant(me, recv)))
			var before int64
			if counting {
				before = bc.SentBytes()
			}
			if err := g.AllToAllV(in, out, send, recv); err != nil {
				return err
			}
			if err := expectEq(fmt.Sprintf("all_to_all_v %s send %v recv %v", dt, send, recv), out, a2aWantIn(dt, me, recv)); err != nil {
				return err
			}
			if counting {
				if got := bc.SentBytes() - before; got != int64(sent) {
					return fmt.Errorf("rank %d: all_to_all_v sent %d bytes, want %d (the blocks for the other ranks)", me, got, sent)
				}
			}
		}
	}
	return nil
}

var allDTypes = []tensor.DType{tensor.Float32, tensor.Float64, tensor.Int32, tensor.BFloat16, tensor.Float16}

func init() {
	scenarios["all_to_all"] = func(g Group) {
		if err := checkAllToAll(g, allDTypes); err != nil {
			fmt.Println("RESULT", err)
		} else {
			fmt.Println("RESULT ok")
		}
		if err := g.Close(); err != nil {
			fmt.Println("RESULT close:", err)
		}
	}
	// The last rank never calls the all-to-all; the others report how
	// theirs ended (at the helper's 5 s deadline).
	scenarios["all_to_all_stall"] = func(g Group) {
		if err := g.Barrier(); err != nil {
			fmt.Println("RESULT", err)
			return
		}
		if g.Rank() == g.Size()-1 {
			time.Sleep(8 * time.Second)
			return
		}
		in := a2aIn(tensor.Float32, g.Rank(), []int{5, 5, 5})
		err := g.AllToAll(in, tensor.Default.New(tensor.Comm, tensor.Float32, 15))
		fmt.Println("RESULT", err)
		time.Sleep(time.Minute) // mpirun ends the job
	}
}

// Exact results at 1 to 5 ranks in goroutines (local backend), every dtype.
// The tcp backend's runs are in alltoall_shm_test.go, with and without its
// shared-memory segment.
func TestAllToAllLocal(t *testing.T) {
	for n := 1; n <= 5; n++ {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			t.Parallel()
			require.NoError(t, RunLocal(n, Options{ChunkBytes: 4096}, func(g Group) error {
				return checkAllToAll(g, allDTypes)
			}))
		})
	}
}

// Real processes of the tcp backend at 2, 3 and 4 ranks, over their
// shared-memory segment and (TINYACC_SHM=0) over sockets.
func TestAllToAllTCPProcesses(t *testing.T) {
	for _, shm := range []string{"1", "0"} {
		for _, n := range []int{2, 3, 4} {
			t.Run(fmt.Sprintf("shm=%s/n=%d", shm, n), func(t *testing.T) {
				t.Setenv("TINYACC_SHM", shm)
				for r, out := range startRanks(t, n, "all_to_all") {
					assert.Equal(t, "ok", result(out), "rank %d", r)
				}
			})
		}
	}
}

// The async forms run in issue order on the collective queue and may be
// waited in any order, mixed with other collectives.
func TestAllToAllAsync(t *testing.T) {
	for name, run := range backendRunners {
		t.Run(name, func(t *testing.T) {
			const n = 3
			require.NoError(t, run(t, n, Options{}, func(g Group) error {
				me := g.Rank()
				equal := []int{4000, 4000, 4000}
				in1 := a2aIn(tensor.Float32, me, equal)
				out1 := tensor.Default.New(tensor.Comm, tensor.Float32, in1.Numel())
				h1 := g.AllToAllAsync(in1, out1)
				x := filled(tensor.Float32, me, 9000, 1)
				hr := g.AllReduceAsync(x, Sum)
				send, recv := make([]int, n), make([]int, n)
				for p := range n {
					send[p], recv[p] = a2aCount(me, p, n, 50), a2aCount(p, me, n, 50)
				}
				in2 := a2aIn(tensor.Float64, me, send)
				out2 := tensor.Default.New(tensor.Comm, tensor.Float64, len(a2aWant(me, recv)))
				h2 := g.AllToAllVAsync(in2, out2, send, recv)
				for _, h := range []Handle{h2, hr, h1} {
					if err := h.Wait(); err != nil {
						return err
					}
				}
				if err := expectEq("async all_to_all", out1, a2aWant(me, equal)); err != nil {
					return err
				}
				if err := expectEq("async all_to_all_v", out2, a2aWant(me, recv)); err != nil {
					return err
				}
				return expectEq("async all_reduce between them", x, refReduce(tensor.Float32, Sum, n, 9000, 1))
			}))
		})
	}
}

// Bad arguments fail on the caller's goroutine with what to change, and use
// up no sequence number.
func TestAllToAllRejectsBadArguments(t *testing.T) {
	require.NoError(t, RunLocal(2, Options{}, func(g Group) error {
		f32 := func(n int) *tensor.Tensor { return tensor.Default.New(tensor.Comm, tensor.Float32, n) }
		in := f32(4)
		cases := []struct {
			err  error
			want string
		}{
			{g.AllToAll(f32(5), f32(5)), `comm: all_to_all on group "world": input has 5 elements, not a multiple of the group size 2`},
			{g.AllToAll(f32(4), f32(6)), `comm: all_to_all on group "world": output has 6 elements, want the input's 4`},
			{g.AllToAll(in, in), `comm: all_to_all on group "world": input and output share memory; all-to-all does not work in place (give it a separate output)`},
			{g.AllToAll(f32(4), tensor.Default.New(tensor.Comm, tensor.Float64, 4)), `comm: all_to_all on group "world": dtype float32 and float64 differ`},
			{g.AllToAllV(f32(3), f32(3), []int{1, 2, 0}, []int{1, 2}), `comm: all_to_all_v on group "world": 3 sendCounts for a group of size 2`},
			{g.AllToAllV(f32(3), f32(3), []int{1, 2}, []int{4, -1}), `comm: all_to_all_v on group "world": negative recvCounts[1] = -1`},
			{g.AllToAllV(f32(3), f32(3), []int{1, 1}, []int{1, 2}), `comm: all_to_all_v on group "world": input has 3 elements, want the sum of sendCounts 2`},
			{g.AllToAllV(f32(3), f32(2), []int{1, 2}, []int{1, 2}), `comm: all_to_all_v on group "world": output has 2 elements, want the sum of recvCounts 3`},
		}
		for i, c := range cases {
			if c.err == nil || c.err.Error() != c.want {
				return fmt.Errorf("case %d: got %v, want %s", i, c.err, c.want)
			}
		}
		// The group still works, at seq 1.
		return g.Barrier()
	}))
}

// A rank that never calls the all-to-all: the others give up at their
// deadline, naming it and where it stopped.
func TestAllToAllDeadlineNamesMissingRank(t *testing.T) {
	for name, run := range backendRunners {
		t.Run(name, func(t *testing.T) {
			checkA2ADeadline(t, run)
		})
	}
}

func checkA2ADeadline(t *testing.T, run runner) {
	const n = 3
	others := make(chan struct{}, n)
	err := run(t, n, Options{Timeout: 300 * time.Millisecond}, func(g Group) error {
		if err := g.Barrier(); err != nil {
			return err
		}
		if g.Rank() == 1 {
			for range n - 1 {
				<-others
			}
			return nil
		}
		send := []int{30000, 30000, 30000}
		err := g.AllToAllV(a2aIn(tensor.Float32, g.Rank(), send), tensor.Default.New(tensor.Comm, tensor.Float32, 90000), send, send)
		others <- struct{}{}
		return err
	})
	errs := rankErrors(err)
	require.Len(t, errs, 2, "%v", err)
	for _, r := range []int{0, 2} {
		assert.Regexp(t, fmt.Sprintf(`^rank %d: comm: all_to_all_v on group "world" seq 2 failed after \d+ms: ranks \[1\] did not arrive \(rank 1: last started seq 1\)$`, r), errs[r])
	}
}
