//go:build cgo && linux

package comm

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The all-to-all checks on the mpi backend, as ranks mpirun started.
func TestMPIAllToAll(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			out := runMPI(t, n, "all_to_all")
			for r := range n {
				assert.Contains(t, out, fmt.Sprintf("[1,%d]<stdout>:RESULT ok\n", r), "rank %d", r)
			}
			assert.NotContains(t, out, "RESULT close:")
		})
	}
}

// A rank that never calls the all-to-all under mpirun: the others time out
// naming it and where it stopped.
func TestMPIAllToAllTimeoutNamesMissingRank(t *testing.T) {
	out := runMPI(t, 3, "all_to_all_stall")
	for r := range 2 {
		assert.Contains(t, out, fmt.Sprintf(`[1,%d]<stdout>:RESULT comm: all_to_all on group "world" seq 2 did not finish within 5s on the mpi backend: ranks [2] did not arrive (rank 2: last started seq 1)`+"\n", r), "rank %d", r)
	}
}
