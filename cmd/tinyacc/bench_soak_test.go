package main

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSlope(t *testing.T) {
	assert.InDelta(t, 0.002, slope([][2]float64{{1000, 40}, {2000, 42}, {3000, 44}, {4000, 46}}), 1e-12)
	assert.InDelta(t, 0, slope([][2]float64{{1000, 40}, {2000, 41}, {3000, 40}, {4000, 41}, {5000, 40}}), 0.0002)
	assert.Equal(t, 0.0, slope([][2]float64{{1000, 40}}))
}

// A short soak prints 20 samples per run and one slope per process: the
// process alone, then the launcher and each rank of --nproc 2.
func TestBenchSoakReportsSlopes(t *testing.T) {
	bin := tinyaccBinary(t)
	cmd := exec.Command(bin, "bench", "soak", "--steps", "40", "--nproc", "2")
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "%s", stderr.String())
	out := stdout.String()
	assert.Equal(t, 2*soakSamples, strings.Count(out, "\n  step "), out)
	assert.Regexp(t, regexp.MustCompile(`(?m)^  slope \(MB/1000 steps\)  process [+-]\d+\.\d{3}$`), out)
	assert.Regexp(t, regexp.MustCompile(`(?m)^  slope \(MB/1000 steps\)  launcher [+-]\d+\.\d{3}  rank 0 [+-]\d+\.\d{3}  rank 1 [+-]\d+\.\d{3}$`), out)
}
