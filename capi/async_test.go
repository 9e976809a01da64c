package main

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Started reduce-scatters in a world of one: each leaves its own input
// (the average over one rank) in its own output, waited for in any order;
// a bad op is refused before anything starts, a size that does not match
// the world comes back from the wait, and a handle is waited for once.
func TestStartedReduceScattersFinishOnWait(t *testing.T) {
	for _, k := range []string{"RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"} {
		t.Setenv(k, "")
		require.NoError(t, os.Unsetenv(k))
	}
	defer func() { require.NoError(t, apiDistFinalize()) }()
	ins := [][]float32{{1, 2, 3}, {-4, 5}, {6.5}}
	outs := make([][]float32, len(ins))
	handles := make([]int64, len(ins))
	for i, in := range ins {
		outs[i] = make([]float32, len(in))
		h, err := apiReduceScatterStart(in, outs[i], 1)
		require.NoError(t, err)
		handles[i] = h
	}
	for i := len(handles) - 1; i >= 0; i-- {
		require.NoError(t, apiCollectiveWait(handles[i]))
		assert.Equal(t, ins[i], outs[i])
	}
	err := apiCollectiveWait(handles[0])
	require.Error(t, err)
	assert.Equal(t, errBadHandle, codeOf(err))

	_, err = apiReduceScatterStart([]float32{1}, []float32{0}, 9)
	require.Error(t, err)
	assert.Equal(t, errInvalidArg, codeOf(err))

	h, err := apiReduceScatterStart([]float32{1, 2}, []float32{0}, 0)
	require.NoError(t, err)
	err = apiCollectiveWait(h)
	require.Error(t, err)
	assert.Equal(t, "reduce_scatter: input holds 2 elements but world size 1 x output 1 = 1", err.Error())
}
