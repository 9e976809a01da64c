package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
	require.Contains(t, log.String(), "; largest layer norms: wte.weight=")
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

// TestGuardStepNumbersAgree: the guard's line for a skipped step, the
// error that ends the run and the trainer's progress all name a step the
// same way (from 1), and the line names three layers, not all of them.
func TestGuardStepNumbersAgree(t *testing.T) {
	cfg := ptest.Config()
	cfg.Train.Steps = 6
	var log, progress bytes.Buffer
	g := &guard.Guard{MaxSkips: 1, MaxNorm: 1e-9, Log: &log}
	tr, err := trainer.New(cfg, trainer.Options{Train: ptest.Corpus(), Plugins: []trainer.Plugin{g}, Log: &progress})
	require.NoError(t, err)
	_, err = tr.Run(t.Context())
	require.Error(t, err)
	require.Regexp(t, `^step 2: trainer: nonfinite_guard pre-step: nonfinite_guard: 2 steps in a row had bad gradients, the last step 2 `+
		`\(nonfinite_guard.max_skips=1\): the gradient norm [0-9.]+ exceeds nonfinite_guard.max_norm=1e-09$`, err.Error())
	lines := strings.Split(strings.TrimSpace(log.String()), "\n")
	require.Len(t, lines, 2)
	for i, l := range lines {
		require.Regexp(t, fmt.Sprintf(`^nonfinite_guard: step %d skipped: the gradient norm [0-9.]+ exceeds nonfinite_guard.max_norm=1e-09; `+
			`largest layer norms: [^ =]+=[0-9.e-]+ [^ =]+=[0-9.e-]+ [^ =]+=[0-9.e-]+$`, i+1), l)
	}
	require.Contains(t, progress.String(), "step 1/6  loss ")
	require.Contains(t, progress.String(), "  norm 0 (every gradient zero: skipped)  ")
}

// TestReadmeCommand runs the command the README gives for this example on
// the default model and corpus: it skips the first steps whose gradient
// norm exceeds the threshold, trains on, and exits 0.
func TestReadmeCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("trains the default model for 30 steps")
	}
	dir := t.TempDir()
	for _, b := range [][2]string{{"tinyacc", "../../../cmd/tinyacc"}, {"nonfinite_guard", "."}} {
		out, err := exec.Command("go", "build", "-o", filepath.Join(dir, b[0]), b[1]).CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	cmd := exec.Command(filepath.Join(dir, "tinyacc"), "train", "--plugins.process="+filepath.Join(dir, "nonfinite_guard"),
		"--nonfinite_guard.max_norm=5.5", "--train.steps=30")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Regexp(t, `(?m)^\[plugin nonfinite_guard rank 0\] nonfinite_guard: step 1 skipped: the gradient norm [0-9.]+ exceeds nonfinite_guard.max_norm=5.5; largest layer norms: `, string(out))
	require.Contains(t, string(out), "tinyacc: trained 30 steps in ")
	for _, l := range strings.Split(string(out), "\n") {
		require.Less(t, len(l), 300, "a short line: %q", l)
	}
}
