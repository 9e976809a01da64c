//go:build linux

package comm

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/tensor"
)

func segmentOf(g Group) *shmSeg {
	gr := g.(*group)
	if gr.segState != segOn {
		return nil
	}
	return gr.seg
}

// Every collective through the segment, at 2, 3, 4 and 8 ranks, every dtype,
// from no element to buffers of several rounds (the 64 KiB halves make
// 10007 float64 two rounds), sizes that do not divide by the rank count,
// against the serial reference; reduce also with sum and avg, and a
// sub-group of ranks 1.. gets a segment of its own.
func TestSegmentCollectivesEveryRankCount(t *testing.T) {
	t.Setenv("TINYACC_SHM", "1")
	for _, n := range []int{2, 3, 4, 8} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			dtypes := []tensor.DType{tensor.Float32, tensor.Float64, tensor.Int32, tensor.BFloat16, tensor.Float16}
			require.NoError(t, runTCP(t, n, Options{ChunkBytes: 32 << 10}, func(g Group) error {
				if err := checkAllOps(g, dtypes); err != nil {
					return err
				}
				if segmentOf(g) == nil {
					return fmt.Errorf("rank %d: the world group has no segment", g.Rank())
				}
				for _, dt := range dtypes {
					for _, op := range []ReduceOp{Sum, Avg} {
						if op == Avg && dt == tensor.Int32 {
							continue
						}
						for _, cnt := range []int{1, 5, 70001} {
							x := filled(dt, g.Rank(), cnt, 9)
							if err := g.Reduce(x, 1, op); err != nil {
								return err
							}
							if g.Rank() == 1 {
								if err := expectEq(fmt.Sprintf("reduce %s %s n=%d", op, dt, cnt), x, refReduce(dt, op, n, cnt, 9)); err != nil {
									return err
								}
							}
						}
					}
				}
				rest := make([]int, n-1)
				for i := range rest {
					rest[i] = i + 1
				}
				sub, err := g.NewGroup(rest)
				if err != nil || sub == nil {
					return err
				}
				x := filled(tensor.Float32, g.Rank()-1, 1001, 2)
				if err := sub.AllReduce(x, Sum); err != nil {
					return err
				}
				if err := expectEq("sub-group all_reduce", x, refReduce(tensor.Float32, Sum, n-1, 1001, 2)); err != nil {
					return err
				}
				if n > 2 && segmentOf(sub) == nil {
					return fmt.Errorf("rank %d: the sub-group has no segment", g.Rank())
				}
				return sub.Close()
			}))
		})
	}
}

// One large all-reduce and reduce-scatter, 64 MiB of float32 on 4 ranks in
// the default halves (many rounds), exact.
func TestSegmentLargeBuffers(t *testing.T) {
	t.Setenv("TINYACC_SHM", "1")
	const n, cnt = 4, 16<<20 + 3
	require.NoError(t, runTCP(t, n, Options{}, func(g Group) error {
		x := filled(tensor.Float32, g.Rank(), cnt, 0)
		if err := g.AllReduce(x, Sum); err != nil {
			return err
		}
		if err := expectEq("all_reduce 64 MiB", x, refReduce(tensor.Float32, Sum, n, cnt, 0)); err != nil {
			return err
		}
		const per = cnt / n
		out := tensor.Default.New(tensor.Comm, tensor.Float32, per)
		in := filled(tensor.Float32, g.Rank(), per*n, 1)
		if err := g.ReduceScatter(in, out, Sum); err != nil {
			return err
		}
		full := refReduce(tensor.Float32, Sum, n, per*n, 1)
		return expectEq("reduce_scatter 64 MiB", out, full[g.Rank()*per:(g.Rank()+1)*per])
	}))
}

// A reduce-scatter never copies the part of a rank's input that the rank
// folds itself: the bytes of its halves where that part would go keep
// what was there before, and the result is still exact.
func TestSegmentOwnPartIsNotCopiedIn(t *testing.T) {
	t.Setenv("TINYACC_SHM", "1")
	const n = 4
	require.NoError(t, runTCP(t, n, Options{ChunkBytes: 32 << 10}, func(g Group) error {
		if err := g.AllReduce(filled(tensor.Float32, g.Rank(), 1, 0), Sum); err != nil {
			return err
		}
		s := segmentOf(g)
		if s == nil {
			return fmt.Errorf("rank %d: no segment", g.Rank())
		}
		piece := (s.slot / n) &^ 63
		own := func(h int) []byte { return s.half(s.me, h)[s.me*piece : (s.me+1)*piece] }
		for h := range 2 {
			for i := range own(h) {
				own(h)[i] = 0xa5
			}
		}
		per := piece / 4 // one round
		out := tensor.Default.New(tensor.Comm, tensor.Float32, per)
		if err := g.ReduceScatter(filled(tensor.Float32, g.Rank(), per*n, 1), out, Sum); err != nil {
			return err
		}
		for h := range 2 {
			if i := slices.IndexFunc(own(h), func(b byte) bool { return b != 0xa5 }); i >= 0 {
				return fmt.Errorf("rank %d: byte %d of its own part in half %d was written", g.Rank(), i, h)
			}
		}
		full := refReduce(tensor.Float32, Sum, n, per*n, 1)
		return expectEq("reduce_scatter", out, full[g.Rank()*per:(g.Rank()+1)*per])
	}))
}

// noisy is rank r's input for the determinism tests: values whose sums
// round, so a different order of the additions shows in the bits.
func noisy(dt tensor.DType, r, cnt int) *tensor.Tensor {
	rng := rand.New(rand.NewSource(int64(1000*r + cnt)))
	t := tensor.Default.New(tensor.Comm, dt, cnt)
	for i := range cnt {
		t.Set(i, (rng.Float64()-0.5)*math.Pow(10, float64(rng.Intn(7)-3)))
	}
	return t
}

// rankOrderSum is the sum of the ranks' noisy inputs in rank order, in
// dtype dt's arithmetic: ((x0 + x1) + x2) + ...
func rankOrderSum(dt tensor.DType, n, cnt int) []float64 {
	acc := noisy(dt, 0, cnt).Clone(tensor.Comm)
	for r := 1; r < n; r++ {
		x := noisy(dt, r, cnt)
		switch dt {
		case tensor.Float32:
			a, b := acc.F32(), x.F32()
			for i := range a {
				a[i] += b[i]
			}
		default:
			a, b := acc.F64(), x.F64()
			for i := range a {
				a[i] += b[i]
			}
		}
	}
	return acc.Float64s()
}

// sumBits runs an all-reduce and a reduce-scatter of the noisy inputs on n
// ranks and returns rank 0's results as bits.
func sumBits(t *testing.T, n, cnt int, dt tensor.DType) (ar, rs []uint64) {
	t.Helper()
	bits := func(x *tensor.Tensor) []uint64 {
		v := x.Float64s()
		out := make([]uint64, len(v))
		for i, f := range v {
			out[i] = math.Float64bits(f)
		}
		return out
	}
	require.NoError(t, runTCP(t, n, Options{ChunkBytes: 32 << 10}, func(g Group) error {
		x := noisy(dt, g.Rank(), cnt)
		if err := g.AllReduce(x, Sum); err != nil {
			return err
		}
		out := tensor.Default.New(tensor.Comm, dt, cnt/n)
		if err := g.ReduceScatter(noisy(dt, g.Rank(), cnt/n*n), out, Sum); err != nil {
			return err
		}
		if g.Rank() == 0 {
			ar, rs = bits(x), bits(out)
		}
		return nil
	}))
	return ar, rs
}

// Results do not depend on timing: repeated jobs give the same bits, which
// are those of adding the ranks' inputs in rank order, at sizes of one
// round and of several; small buffers give the bits of the tcp backend's
// direct algorithm.
func TestSegmentSumsAreBitwiseDeterministic(t *testing.T) {
	const n = 4
	for _, dt := range []tensor.DType{tensor.Float32, tensor.Float64} {
		for _, cnt := range []int{1001, 100003} {
			t.Setenv("TINYACC_SHM", "1")
			want := rankOrderSum(dt, n, cnt)
			wantBits := make([]uint64, len(want))
			for i, f := range want {
				wantBits[i] = math.Float64bits(f)
			}
			first, firstRS := sumBits(t, n, cnt, dt)
			require.Equal(t, wantBits, first, "%s n=%d: all_reduce differs from the rank-order sum", dt, cnt)
			var wantRS []uint64
			for _, f := range rankOrderSum(dt, n, cnt/n*n)[:cnt/n] {
				wantRS = append(wantRS, math.Float64bits(f))
			}
			require.Equal(t, wantRS, firstRS, "%s n=%d: reduce_scatter differs from the rank-order sum", dt, cnt)
			for run := 0; run < 2; run++ {
				again, againRS := sumBits(t, n, cnt, dt)
				require.Equal(t, first, again, "%s n=%d run %d", dt, cnt, run)
				require.Equal(t, firstRS, againRS, "%s n=%d run %d", dt, cnt, run)
			}
			if cnt*dt.Size() <= smallBytes {
				t.Setenv("TINYACC_SHM", "0")
				tcp, _ := sumBits(t, n, cnt, dt)
				assert.Equal(t, first, tcp, "%s n=%d: the tcp direct algorithm's bits", dt, cnt)
			}
		}
	}
}

// signalScenario: rank 3 sends itself sig once its copy of the fifth round
// of a 16 MiB all-reduce is in, so the others wait for its fold.
func signalScenario(sig syscall.Signal) func(g Group) {
	return func(g Group) {
		if err := g.Barrier(); err != nil {
			fmt.Println("RESULT", err)
			os.Exit(0)
		}
		x := filled(tensor.Float32, g.Rank(), 1<<22, 0)
		if g.Rank() == 3 {
			segRoundHook = func(k uint64) {
				if k == 4 {
					_ = syscall.Kill(os.Getpid(), sig)
				}
			}
		}
		err := g.AllReduce(x, Sum)
		if err == nil && segmentOf(g) == nil {
			err = errors.New("the all-reduce did not use a segment")
		}
		fmt.Println("RESULT", err)
		os.Exit(0)
	}
}

func init() {
	scenarios["sigkill"] = signalScenario(syscall.SIGKILL)
	scenarios["sigstop"] = signalScenario(syscall.SIGSTOP)
}

// startRanksKillingLast is startRanks for a last rank that may never exit
// by itself: once the others ended it is killed. It returns the outputs
// and the processes' ids.
func startRanksKillingLast(t *testing.T, n int, scenario string) ([]string, []int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	outs := make([]*bytes.Buffer, n)
	cmds := make([]*exec.Cmd, n)
	pids := make([]int, n)
	for r := range n {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), "TINYACC_SHM=1",
			"TINYACC_TEST_SCENARIO="+scenario,
			"RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(n),
			"LOCAL_RANK="+strconv.Itoa(r), "LOCAL_WORLD_SIZE="+strconv.Itoa(n),
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port),
			"TINYACC_JOB_TOKEN=process-test-token")
		outs[r] = &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = outs[r], outs[r]
		require.NoError(t, cmd.Start())
		cmds[r], pids[r] = cmd, cmd.Process.Pid
	}
	for r := 0; r < n-1; r++ {
		_ = cmds[r].Wait()
	}
	_ = cmds[n-1].Process.Kill()
	_ = cmds[n-1].Wait()
	res := make([]string, n)
	for r := range n {
		res[r] = outs[r].String()
	}
	return res, pids
}

// noSegmentFiles fails when /dev/shm holds a file of one of pids.
func noSegmentFiles(t *testing.T, pids []int) {
	t.Helper()
	files, err := filepath.Glob(shmDir + "/tinyacc-*")
	require.NoError(t, err)
	for _, f := range files {
		for _, pid := range pids {
			if strings.Contains(filepath.Base(f), fmt.Sprintf("-%d-", pid)) {
				t.Errorf("%s of process %d is left in %s", f, pid, shmDir)
			}
		}
	}
}

// A rank SIGKILLed in the middle of a large all-reduce through the segment:
// the others fail at once, naming it, and nothing is left in /dev/shm.
func TestSegmentRankKilledMidAllReduce(t *testing.T) {
	outs, pids := startRanksKillingLast(t, 4, "sigkill")
	for r := 0; r < 3; r++ {
		assert.Regexp(t, `^comm: all_reduce on group "world" seq 2 failed after [0-9.]+(µs|ms|s): ranks \[3\] did not arrive \(rank 3: connection closed\)$`, result(outs[r]), "rank %d", r)
		// Not at the deadline: a timed-out operation reports exactly the
		// timeout (5 s in the helper).
		assert.NotContains(t, result(outs[r]), "failed after 5s:", "rank %d waited for its deadline", r)
	}
	noSegmentFiles(t, pids)
}

// A rank SIGSTOPped in the middle of a large all-reduce: the others fail at
// their deadline (5 s in the helper; a rank that started later ends when
// the first tells it), naming it, and nothing is left in /dev/shm once it
// is killed.
func TestSegmentRankStoppedMidAllReduce(t *testing.T) {
	outs, pids := startRanksKillingLast(t, 4, "sigstop")
	for r := 0; r < 3; r++ {
		assert.Regexp(t, `^comm: all_reduce on group "world" seq 2 failed after [0-9.]+s: ranks \[3\] did not arrive \(rank 3: no answer: .*\)$`, result(outs[r]), "rank %d", r)
	}
	noSegmentFiles(t, pids)
}
