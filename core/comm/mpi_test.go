//go:build cgo && linux

package comm

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/tensor"
)

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

// mpirunArgs is how the tests start ranks: as root Open MPI wants
// --allow-run-as-root, and 4 ranks on a 2-core machine need --oversubscribe.
func mpirunArgs(n int) []string {
	return []string{"--allow-run-as-root", "--oversubscribe", "-np", strconv.Itoa(n)}
}

// The collective suite the tcp backend passes, on the mpi backend as ranks
// that mpirun started.
func TestMPIProcesses(t *testing.T) {
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		t.Skip("mpirun is not installed (make deps installs openmpi-bin)")
	}
	for _, n := range []int{2, 4} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			args := append(mpirunArgs(n), "--tag-output", os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
			cmd := exec.Command(mpirun, args...)
			cmd.Env = append(os.Environ(), "TINYACC_TEST_SCENARIO=suite", "TINYACC_TEST_BACKEND=mpi", "OMP_NUM_THREADS=1")
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			require.NoError(t, cmd.Run(), "%s", out.String())
			for r := range n {
				assert.Contains(t, out.String(), fmt.Sprintf("[1,%d]<stdout>:RESULT ok\n", r), "rank %d", r)
			}
			assert.NotContains(t, out.String(), "RESULT close:")
		})
	}
}

// runMPI runs scenario on n ranks under mpirun and returns its output.
func runMPI(t *testing.T, n int, scenario string) string {
	t.Helper()
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		t.Skip("mpirun is not installed (make deps installs openmpi-bin)")
	}
	args := append(mpirunArgs(n), "--tag-output", os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd := exec.Command(mpirun, args...)
	cmd.Env = append(os.Environ(), "TINYACC_TEST_SCENARIO="+scenario, "TINYACC_TEST_BACKEND=mpi", "OMP_NUM_THREADS=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	_ = cmd.Run() // mpirun fails the job: one rank died or never finished
	return out.String()
}

// A rank killed with an all-reduce in flight under mpirun: the survivors'
// error names it and the operation, as on the tcp backend, before mpirun
// ends the job. A survivor that had not yet seen the barrier before it
// complete when the rank died reports that barrier instead.
func TestMPIRankKilledIsNamed(t *testing.T) {
	out := runMPI(t, 3, "sigkill")
	for r := range 2 {
		assert.Regexp(t, fmt.Sprintf(`\[1,%d\]<stdout>:RESULT comm: (all_reduce on group "world" seq 2|barrier on group "world" seq 1) failed after [0-9.]+(µs|ms|s) on the mpi backend: ranks \[2\] did not arrive \(rank 2: its process ended \(its connection to the job's store closed\)\)\n`, r), out, "rank %d", r)
	}
}

// A rank that never calls the all-reduce: the others time out naming it
// and where it stopped.
func TestMPITimeoutNamesMissingRank(t *testing.T) {
	out := runMPI(t, 3, "stall")
	for r := range 2 {
		assert.Contains(t, out, fmt.Sprintf(`[1,%d]<stdout>:RESULT comm: all_reduce on group "world" seq 2 did not finish within 5s on the mpi backend: ranks [2] did not arrive (rank 2: last started seq 1)`+"\n", r), "rank %d", r)
	}
}
