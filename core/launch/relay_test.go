package launch

import (
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The relay of a rank's output allocates the same for a hundred lines (the tail is full) as for ten
// thousand: nothing it keeps grows with the length of a run.
func TestPumpHoldsNoGrowingState(t *testing.T) {
	o := &output{stdout: io.Discard, stderr: io.Discard}
	allocs := func(lines int) float64 {
		in := strings.Repeat("step 123/20000  loss 2.3456  lr 3.00e-04\n", lines)
		return testing.AllocsPerRun(3, func() {
			o.pump(strings.NewReader(in), io.Discard, "[rank 1] ", newTail(20))
		})
	}
	require.Equal(t, allocs(100), allocs(10000))
}

func TestOversubscribedWarns(t *testing.T) {
	require.Equal(t, "", oversubscribed(8, 2))
	require.Equal(t, "launch: warning: 1000 ranks on 2 cores (more than 4 per core): each rank starts, loads its data and connects to all 999 others (499500 connections in all) before the deadline (comm.timeout); expect the rendezvous to time out, or use fewer ranks",
		oversubscribed(1000, 2))
}
