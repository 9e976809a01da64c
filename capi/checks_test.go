package main

import (
	"math"
	"path/filepath"
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

// Non-finite optimizer state is never written: the call fails naming the
// tensor, and no file appears.
func TestOptimizerSaveRefusesNonFinite(t *testing.T) {
	h := newHandles(t, testConfig(testCorpus(t), 2))
	_, err := apiRunStep(h.sess)
	require.NoError(t, err)
	o, err := get[optimizerObj](h.opt)
	require.NoError(t, err)
	o.opt.State()["exp_avg.wte.weight"].F32()[3] = float32(math.Inf(-1))
	path := filepath.Join(t.TempDir(), "optim.safetensors")
	require.EqualError(t, apiOptimizerSave(h.opt, path),
		"optimizer state "+path+" not written: tensor exp_avg.wte.weight holds a non-finite value (element 3 = -Inf)")
	require.NoFileExists(t, path)
}
