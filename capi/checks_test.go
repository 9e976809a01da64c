package main

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// The generate call refuses settings that would sample nonsense, before
// any work, naming the setting.
func TestGenerateRefusesBadSettings(t *testing.T) {
	h := newHandles(t, testConfig(testCorpus(t), 2))
	p := []int32{'f'}
	for _, c := range []struct {
		n    int
		temp float64
		topK int
		want string
	}{
		{0, 1, 0, "generate: tokens=0 must be >= 1"},
		{5, math.NaN(), 0, "generate: temperature=NaN must be a finite number >= 0 (0 = greedy)"},
		{5, -1, 0, "generate: temperature=-1 must be a finite number >= 0 (0 = greedy)"},
		{5, math.Inf(1), 0, "generate: temperature=+Inf must be a finite number >= 0 (0 = greedy)"},
		{5, 1, -1, "generate: top_k=-1 must be >= 0 (0 = all tokens)"},
	} {
		_, err := apiGenerate(h.model, p, c.n, c.temp, c.topK, 1)
		require.EqualError(t, err, c.want)
	}
}
