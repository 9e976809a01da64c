package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/examples/plugins/nonfinite_guard/guard"
	"github.com/tinyacc/tinyacc/plugins"
	"github.com/tinyacc/tinyacc/plugins/process"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// TestProcessMatchesCompiled builds this plugin, runs it as a plugin
// process, and holds the weights byte for byte to the same guard compiled
// in; a threshold that skips some steps makes the guard matter.
func TestProcessMatchesCompiled(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "nonfinite_guard")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)

	cfg := ptest.Config()
	cfg.Train.Steps = 6
	const maxNorm = 2.1
	train := func(name string, ps []trainer.Plugin) []byte {
		c := cfg
		c.SaveTo = filepath.Join(dir, name+".safetensors")
		tr, err := trainer.New(c, trainer.Options{Train: ptest.Corpus(), Plugins: ps})
		require.NoError(t, err)
		_, err = tr.Run(t.Context())
		require.NoError(t, err)
		b, err := os.ReadFile(c.SaveTo)
		require.NoError(t, err)
		return b
	}
	var log bytes.Buffer
	compiled := &guard.Guard{MaxSkips: 10, MaxNorm: maxNorm, Log: &log}
	want := train("compiled", []trainer.Plugin{compiled})
	require.Greater(t, compiled.Skipped, 0, "the threshold should skip some steps")
	require.Less(t, compiled.Skipped, cfg.Train.Steps, "and keep others")
	require.Contains(t, log.String(), "per-layer norms: wte.weight=")
	require.NotEqual(t, train("unguarded", nil), want, "skipping steps changes the weights")

	r, err := config.LoadWith("", nil, []string{"--plugins.process=" + bin, "--nonfinite_guard.max_norm=2.1", "--nonfinite_guard.max_skips=10"}, process.Declare)
	require.NoError(t, err)
	c := cfg
	c.Plugins, c.Declared = r.Config.Plugins, r.Config.Declared
	ps, _, err := plugins.Build(c, nil)
	require.NoError(t, err)
	defer process.CloseAll(ps)
	require.Len(t, ps, 1)
	cfg = c
	require.Equal(t, want, train("process", ps), "process and compiled guards must give the same weights")
}
