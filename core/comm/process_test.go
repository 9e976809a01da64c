package comm

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// TestHelperProcess is one rank of a multi-process test: the test binary
// re-executes itself with TINYACC_TEST_SCENARIO and the launcher's variables.
// It reports on stdout; it is skipped in a normal run.
func TestHelperProcess(t *testing.T) {
	scenario := os.Getenv("TINYACC_TEST_SCENARIO")
	if scenario == "" {
		t.Skip("only runs as a child of the process tests")
	}
	g, err := InitFromEnv(Options{Backend: os.Getenv("TINYACC_TEST_BACKEND"), Timeout: 5 * time.Second})
	if err != nil {
		fmt.Println("RESULT init:", err)
		os.Exit(0)
	}
	switch scenario {
	case "collectives":
		if err := checkAllOps(g, []tensor.DType{tensor.Float32}); err != nil {
			fmt.Println("RESULT", err)
		} else {
			fmt.Println("RESULT ok")
		}
		_ = g.Close()
	case "suite":
		if err := checkSuite(g); err != nil {
			fmt.Println("RESULT", err)
		} else {
			fmt.Println("RESULT ok")
		}
		if err := g.Close(); err != nil {
			fmt.Println("RESULT close:", err)
		}
	case "kill":
		if err := g.Barrier(); err != nil {
			fmt.Println("RESULT", err)
			os.Exit(0)
		}
		x := filled(tensor.Float32, g.Rank(), 1<<22, 0)
		if g.Rank() == 3 {
			g.AllReduceAsync(x, Sum)
			os.Exit(3) // dies with the all-reduce in flight
		}
		err := g.AllReduce(x, Sum)
		fmt.Println("RESULT", err)
		os.Exit(0)
	case "sigkill", "stall":
		// The last rank is killed with an all-reduce in flight, or never
		// calls it; the others report how their all-reduce ended.
		if err := g.Barrier(); err != nil {
			fmt.Println("RESULT", err)
			os.Exit(0)
		}
		x := filled(tensor.Float32, g.Rank(), 1<<16, 0)
		if g.Rank() == g.Size()-1 {
			if scenario == "sigkill" {
				g.AllReduceAsync(x, Sum)
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
			// Stay (stopped as far as the others know) until they have
			// reported, then leave: mpirun ends the job.
			time.Sleep(8 * time.Second)
			os.Exit(0)
		}
		err := g.AllReduce(x, Sum)
		fmt.Println("RESULT", err)
		time.Sleep(time.Minute) // the store stays up for the others; mpirun ends the job
		os.Exit(0)
	default:
		if f := scenarios[scenario]; f != nil {
			f(g)
		}
	}
}

// checkSuite is what a backend under test runs as real processes: every
// collective in every dtype against the serial reference, the same on a
// sub-group in reverse rank order, and a send/recv ring.
func checkSuite(g Group) error {
	all := []tensor.DType{tensor.Float32, tensor.Float64, tensor.Int32, tensor.BFloat16, tensor.Float16}
	if err := checkAllOps(g, all); err != nil {
		return err
	}
	n, me := g.Size(), g.Rank()
	var rev []int
	for r := n - 1; r >= 1; r-- {
		rev = append(rev, r)
	}
	sub, err := g.NewNamedGroup("rev", rev)
	if err != nil {
		return err
	}
	if (sub == nil) != (me == 0) {
		return fmt.Errorf("rank %d: sub-group %v is %v", me, rev, sub)
	}
	if sub != nil {
		if want := n - 1 - me; sub.Rank() != want || sub.WorldRank(sub.Rank()) != me {
			return fmt.Errorf("rank %d: sub-group rank %d, want %d", me, sub.Rank(), want)
		}
		if err := checkAllOps(sub, []tensor.DType{tensor.Float32}); err != nil {
			return fmt.Errorf("sub-group: %w", err)
		}
		if err := sub.Close(); err != nil {
			return err
		}
	}
	for round := range 3 {
		cnt := []int{0, 5, 20000}[round]
		if err := g.Send(filled(tensor.Float32, me, cnt, round), (me+1)%n); err != nil {
			return err
		}
		prev := (me + n - 1) % n
		got := tensor.Default.New(tensor.Comm, tensor.Float32, cnt)
		if err := g.Recv(got, prev); err != nil {
			return err
		}
		if err := expectEq(fmt.Sprintf("recv round %d", round), got, filled(tensor.Float32, prev, cnt, round).Float64s()); err != nil {
			return err
		}
	}
	return nil
}

// scenarios holds the helper process's scenarios that other test files add.
var scenarios = map[string]func(g Group){}

// startRanks runs n copies of this test binary as the ranks of one job.
func startRanks(t *testing.T, n int, scenario string) []string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // rank 0 binds it again
	outs := make([]string, n)
	var wg sync.WaitGroup
	for r := range n {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(),
			"TINYACC_TEST_SCENARIO="+scenario,
			"RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(n),
			"LOCAL_RANK="+strconv.Itoa(r), "LOCAL_WORLD_SIZE="+strconv.Itoa(n),
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port),
			"TINYACC_JOB_TOKEN=process-test-token")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		require.NoError(t, cmd.Start())
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			_ = cmd.Wait()
			outs[r] = out.String()
		}(r)
	}
	wg.Wait()
	return outs
}

func result(out string) string {
	for _, line := range strings.Split(out, "\n") {
		if s, ok := strings.CutPrefix(line, "RESULT "); ok {
			return s
		}
	}
	return "no result in output:\n" + out
}

func TestTCPProcesses(t *testing.T) {
	outs := startRanks(t, 3, "collectives")
	for r, out := range outs {
		assert.Equal(t, "ok", result(out), "rank %d", r)
	}
}

func TestTCPProcessKilledMidAllReduce(t *testing.T) {
	outs := startRanks(t, 4, "kill")
	for r := 0; r < 3; r++ {
		assert.Regexp(t, `^comm: all_reduce on group "world" seq 2 failed after [0-9.]+(µs|ms|s): ranks \[3\] did not arrive \(rank 3: connection closed\)$`, result(outs[r]), "rank %d", r)
	}
}
