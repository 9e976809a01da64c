package main

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBenchTorchRefusesBadFlags(t *testing.T) {
	err := benchTorch([]string{"--nproc", "1"}, io.Discard, io.Discard)
	require.Error(t, err)
	assert.Equal(t, "bench torch: --nproc 1 must be >= 2, --repeats 3 and --steps 5 >= 1", err.Error())
}

// TestReadTorchBenchTakesTheLargestRank: the bytes reported are the
// largest rank's gradient + optimizer bytes; a missing rank is an error.
func TestReadTorchBenchTakesTheLargestRank(t *testing.T) {
	dir := t.TempDir()
	write := func(rank int, body string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "rank"+string(rune('0'+rank))+".json"), []byte(body), 0o644))
	}
	write(0, `{"ms_step": 12.5, "grads_bytes": 100, "optim_bytes": 50, "params": 7, "largest_param_bytes": 16, "bucket_bytes": 1024}`)
	write(1, `{"ms_step": 13, "grads_bytes": 120, "optim_bytes": 60, "params": 7, "largest_param_bytes": 16, "bucket_bytes": 1024}`)
	r, err := readTorchBench(dir, 2)
	require.NoError(t, err)
	assert.Equal(t, 12.5, r.msStep())
	assert.Equal(t, int64(180), r.maxBytes())
	assert.Equal(t, []int64{150, 180}, r.perRank)
	_, err = readTorchBench(dir, 3)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "bench torch: rank 2 wrote no result")
}
