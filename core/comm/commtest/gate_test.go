package commtest

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// An armed gate's all-reduce moves the data but completes only at Open;
// a disarmed gate and ungated kinds pass straight through; a wait before
// Open fails after the deadline, and so does every later withheld one.
func TestGate(t *testing.T) {
	require.NoError(t, comm.RunLocal(2, comm.Options{Timeout: 10 * time.Second}, func(g comm.Group) error {
		gate := NewGate(g, 200*time.Millisecond, AllReduce)
		x := tensor.FromF32([]float32{float32(g.Rank() + 1)}, 1)

		// Not armed: an ordinary all-reduce.
		require.NoError(t, gate.AllReduce(x, comm.Sum))
		require.Equal(t, float32(3), x.F32()[0])

		// Armed: withheld until Open, which counts it.
		gate.Arm()
		h := gate.AllReduceAsync(x, comm.Sum)
		done := make(chan error, 1)
		go func() { done <- h.Wait() }()
		require.Equal(t, 1, gate.Open(true))
		require.NoError(t, <-done)
		require.Equal(t, float32(6), x.F32()[0])

		// Ungated kinds are never withheld.
		gate.Arm()
		require.NoError(t, gate.Broadcast(x, 0))
		require.Equal(t, 0, gate.Open(false))

		// Waited for before Open: fails after the deadline, names the rank.
		err := gate.AllReduce(x, comm.Sum)
		require.ErrorContains(t, err, "all_reduce withheld until the computation it should overlap has run")
		require.ErrorContains(t, err, fmt.Sprintf("rank %d of group %s:", g.Rank(), g.Name()))
		require.Equal(t, err, gate.Err())
		// Later withheld operations fail too (at once: the gate expired).
		require.ErrorContains(t, gate.AllReduceAsync(x, comm.Sum).Wait(), "withheld")
		return nil
	}))
}
