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
)

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
