//go:build linux

package comm

import (
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// Exact results on the tcp backend at 2, 3 and 4 ranks, every dtype,
// through the shared-memory segment (its 64 KiB halves make the largest
// blocks take several rounds) and, with TINYACC_SHM=0, over sockets.
func TestAllToAllTCP(t *testing.T) {
	for _, shm := range []string{"1", "0"} {
		for _, n := range []int{2, 3, 4} {
			t.Run(fmt.Sprintf("shm=%s/n=%d", shm, n), func(t *testing.T) {
				t.Setenv("TINYACC_SHM", shm)
				require.NoError(t, runTCP(t, n, Options{ChunkBytes: 4096}, func(g Group) error {
					if err := checkAllToAll(g, allDTypes); err != nil {
						return err
					}
					if on := segmentOf(g) != nil; on != (shm == "1") {
						return fmt.Errorf("rank %d: segment in use %v with TINYACC_SHM=%s", g.Rank(), on, shm)
					}
					return nil
				}))
			})
		}
	}
}

// 16 MiB from every rank of 4 in the default 1 MiB halves, equal and
// uneven, exact.
func TestAllToAllSegmentLarge(t *testing.T) {
	t.Setenv("TINYACC_SHM", "1")
	const n, blk = 4, 1 << 20
	require.NoError(t, runTCP(t, n, Options{}, func(g Group) error {
		me := g.Rank()
		equal := []int{blk, blk, blk, blk}
		in := a2aIn(tensor.Float32, me, equal)
		out := tensor.Default.New(tensor.Comm, tensor.Float32, in.Numel())
		if err := g.AllToAll(in, out); err != nil {
			return err
		}
		if err := expectEq("all_to_all 16 MiB", out, a2aWant(me, equal)); err != nil {
			return err
		}
		send, recv := make([]int, n), make([]int, n)
		for p := range n {
			send[p], recv[p] = a2aCount(me, p, n, 3*blk), a2aCount(p, me, n, 3*blk)
		}
		in = a2aIn(tensor.Float32, me, send)
		out = tensor.Default.New(tensor.Comm, tensor.Float32, len(a2aWant(me, recv)))
		if err := g.AllToAllV(in, out, send, recv); err != nil {
			return err
		}
		return expectEq(fmt.Sprintf("all_to_all_v send %v", send), out, a2aWant(me, recv))
	}))
}

// All-to-alls between the segment's round-based collectives, issued
// asynchronously back to back, at 3 ranks with 64 KiB halves (pieces of
// 32 KiB, so each block takes several): the streams' counters go on from
// one all-to-all to the next and an all-to-all holds both halves, so every
// result is exact whatever the ranks' order.
func TestAllToAllBetweenSegmentRounds(t *testing.T) {
	t.Setenv("TINYACC_SHM", "1")
	const n = 3
	require.NoError(t, runTCP(t, n, Options{ChunkBytes: 4096}, func(g Group) error {
		me := g.Rank()
		equal := []int{20011, 20011, 20011}
		send, recv := make([]int, n), make([]int, n)
		for p := range n {
			send[p], recv[p] = a2aCount(me, p, n, 30011), a2aCount(p, me, n, 30011)
		}
		x := filled(tensor.Float32, me, 50001, 3)
		a, b := a2aIn(tensor.Float32, me, equal), a2aIn(tensor.Float32, me, send)
		aOut := tensor.Default.New(tensor.Comm, tensor.Float32, a.Numel())
		bOut := tensor.Default.New(tensor.Comm, tensor.Float32, len(a2aWant(me, recv)))
		c := a2aIn(tensor.Float32, me, equal)
		cOut := tensor.Default.New(tensor.Comm, tensor.Float32, c.Numel())
		hs := []Handle{
			g.AllToAllAsync(a, aOut),
			g.AllReduceAsync(x, Sum),
			g.AllToAllVAsync(b, bOut, send, recv),
			g.AllToAllAsync(c, cOut),
		}
		for _, h := range hs {
			if err := h.Wait(); err != nil {
				return err
			}
		}
		if err := expectEq("all_to_all before the all-reduce", aOut, a2aWant(me, equal)); err != nil {
			return err
		}
		if err := expectEq("all_reduce between all-to-alls", x, refReduce(tensor.Float32, Sum, n, 50001, 3)); err != nil {
			return err
		}
		if err := expectEq(fmt.Sprintf("all_to_all_v send %v", send), bOut, a2aWant(me, recv)); err != nil {
			return err
		}
		return expectEq("all_to_all after the all_to_all_v", cOut, a2aWant(me, equal))
	}))
}

// Receive counts that disagree with what the sender sends: through the
// segment every rank fails with the same message before any data moves;
// over sockets the receiver names the sender of the block of another size.
func TestAllToAllVCountMismatch(t *testing.T) {
	for _, shm := range []string{"1", "0"} {
		t.Run("shm="+shm, func(t *testing.T) {
			t.Setenv("TINYACC_SHM", shm)
			const n = 3
			err := runTCP(t, n, Options{}, func(g Group) error {
				send := []int{2, 2, 2}
				recv := []int{2, 2, 2}
				if g.Rank() == 2 {
					recv[0] = 5 // rank 0 sends it 2
				}
				total := 0
				for _, k := range recv {
					total += k
				}
				return g.AllToAllV(a2aIn(tensor.Float32, g.Rank(), send), tensor.Default.New(tensor.Comm, tensor.Float32, total), send, recv)
			})
			errs := rankErrors(err)
			if shm == "1" {
				require.Len(t, errs, n, "%v", err)
				for r := range n {
					assert.Equal(t, "rank "+strconv.Itoa(r)+`: comm: all_to_all_v on group "world" seq 1: rank 0 sends 8 bytes to rank 2, which expects 20: every rank's recvCounts[p] must equal rank p's sendCounts for it`, errs[r])
				}
				return
			}
			assert.Equal(t, `rank 2: comm: all_to_all_v on group "world" seq 1: rank 0 sent a message of a different size: chunk at byte 0 of length 8, last=true, but this rank expects 20 bytes (tensor sizes differ between ranks)`, errs[2])
		})
	}
}

// The deadline on the tcp backend through the segment and over sockets,
// as on the local backend (alltoall_test.go).
func TestAllToAllTCPDeadline(t *testing.T) {
	for _, shm := range []string{"1", "0"} {
		t.Run("shm="+shm, func(t *testing.T) {
			t.Setenv("TINYACC_SHM", shm)
			checkA2ADeadline(t, runTCP)
		})
	}
}

// The bench's all-to-all (tinyacc bench comm --op all_to_all, 16 MiB from
// each of 4 processes) goes through the segment's streams: 4 processes of
// the tcp backend started as the launcher starts them, each checking the
// exact result and that every stream it has carried the pieces a 1 MiB
// half makes of a 4 MiB block. Over messages, or with the segment set up
// and the blocks sent around it, the counts stay 0.
func TestAllToAllProcessesUseSegment(t *testing.T) {
	outs := startRanks(t, 4, "alltoall_segment")
	for r, out := range outs {
		assert.Equal(t, "ok", result(out), "rank %d", r)
	}
}

func init() {
	scenarios["alltoall_segment"] = func(g Group) {
		fmt.Println("RESULT", alltoallThroughSegment(g))
		_ = g.Close()
	}
}

func alltoallThroughSegment(g Group) string {
	const n, blk = 4, 1 << 20 // float32 elements: 4 MiB blocks, 16 MiB from each rank
	const piece = (1 << 20) / (n - 1) &^ 63
	const pieces = (4*blk + piece - 1) / piece // 13
	me := g.Rank()
	counts := []int{blk, blk, blk, blk}
	out := tensor.Default.New(tensor.Comm, tensor.Float32, n*blk)
	if err := g.AllToAll(a2aIn(tensor.Float32, me, counts), out); err != nil {
		return err.Error()
	}
	if err := expectEq("all_to_all", out, a2aWant(me, counts)); err != nil {
		return err.Error()
	}
	s := segmentOf(g)
	if s == nil {
		return "no segment: the all-to-all went over messages"
	}
	for p := range n {
		if p == me {
			continue
		}
		if w, k := s.wrote(me, p).Load(), s.took(me, p).Load(); w != pieces || k != pieces {
			return fmt.Sprintf("stream to rank %d carried %d pieces and from it %d, want %d each", p, w, k, pieces)
		}
	}
	return "ok"
}

// A peer may post what a rank waits for, finish and leave the job between
// the rank's look at the segment and its check that the peer is alive:
// what the peer posted stands, so the wait completes instead of failing
// with "left the job". The hook holds rank 0 between the two until rank 1
// has broadcast (it does not wait for its reader), closed its group and
// been seen gone.
func TestSegmentWaitOutlivesAPeerThatPostedAndLeft(t *testing.T) {
	t.Setenv("TINYACC_SHM", "1")
	waiting := make(chan struct{})
	var once sync.Once
	var armed atomic.Bool // from rank 0's broadcast on, not during set-up
	segWaitHook = func(c *opCtx, p int) {
		if !armed.Load() || c.me() != 0 || p != 1 {
			return
		}
		once.Do(func() {
			close(waiting)
			for c.segAlive(p) == nil {
				runtime.Gosched()
			}
		})
	}
	defer func() { segWaitHook = nil }()
	require.NoError(t, runTCP(t, 2, Options{Timeout: 20 * time.Second}, func(g Group) error {
		buf := tensor.Default.New(tensor.Comm, tensor.Float32, 1<<16)
		if err := g.Broadcast(buf, 0); err != nil { // maps the segment
			return err
		}
		if segmentOf(g) == nil {
			return fmt.Errorf("rank %d: no segment", g.Rank())
		}
		if g.Rank() == 1 {
			select {
			case <-waiting:
			case <-time.After(15 * time.Second):
				return fmt.Errorf("rank 0 never waited in the segment")
			}
			for i := range buf.F32() {
				buf.F32()[i] = float32(i)
			}
			return g.Broadcast(buf, 1)
		}
		armed.Store(true)
		if err := g.Broadcast(buf, 1); err != nil {
			return err
		}
		for i, v := range buf.F32() {
			if v != float32(i) {
				return fmt.Errorf("element %d = %v, want %d", i, v, i)
			}
		}
		return nil
	}))
}
