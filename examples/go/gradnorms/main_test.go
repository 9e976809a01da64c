package main

import (
	"bytes"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// The per-module norms the plugin records must add up (in squares) to the
// global gradient norm the trainer computes on its own for clipping.
func TestLayerNormsAddUpToGlobalNorm(t *testing.T) {
	var out bytes.Buffer
	probe, steps, err := run([]string{"--train.steps=3", "--data.max_bytes=200000"}, &out)
	require.NoError(t, err)
	require.Len(t, probe.Norms, 3)
	require.Equal(t, []string{"embed", "h.0", "h.1", "head"}, probe.Groups)
	for s, row := range probe.Norms {
		var ss float64
		for _, v := range row {
			require.Greater(t, v, 0.0)
			ss += v * v
		}
		require.InEpsilon(t, steps[s].GradNorm, math.Sqrt(ss), 1e-5, "step %d", s)
	}
	require.Contains(t, out.String(), "embed  h.0  h.1  head")
}
