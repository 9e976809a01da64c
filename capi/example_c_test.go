package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCExampleMatchesTrainer builds libtinyacc.so, compiles
// examples/c/train.c against tinyacc.h with gcc, runs it and checks that
// its printed losses equal those of the Go trainer for the same config.
func TestCExampleMatchesTrainer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the shared library")
	}
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found")
	}
	dir := t.TempDir()
	lib := filepath.Join(dir, "libtinyacc.so")
	out, err := exec.Command("go", "build", "-buildmode=c-shared", "-o", lib, ".").CombinedOutput()
	require.NoError(t, err, "go build -buildmode=c-shared: %s", out)
	bin := filepath.Join(dir, "train_c")
	out, err = exec.Command(gcc, "-O2", "-Wall", "-Werror", "-I.", "../examples/c/train.c",
		"-L"+dir, "-ltinyacc", "-Wl,-rpath,"+dir, "-o", bin).CombinedOutput()
	require.NoError(t, err, "gcc: %s", out)

	const steps = 4
	text := testConfig(testCorpus(t), steps)
	cfgFile := filepath.Join(dir, "run.yaml")
	require.NoError(t, os.WriteFile(cfgFile, []byte(text), 0o644))
	out, err = exec.Command(bin, cfgFile).CombinedOutput()
	require.NoError(t, err, "train_c: %s", out)

	var got []float64
	for i, m := range regexp.MustCompile(`(?m)^step (\d+)/(\d+) loss (\S+)`).FindAllStringSubmatch(string(out), -1) {
		// train.steps read through tinyacc_config_get_int; steps from 1.
		require.Equal(t, []string{strconv.Itoa(i + 1), strconv.Itoa(steps)}, m[1:3], "%s", out)
		v, err := strconv.ParseFloat(m[3], 64)
		require.NoError(t, err)
		got = append(got, v)
	}
	want, _ := referenceLosses(t, text, steps)
	assert.Equal(t, want, got, "losses printed by examples/c/train.c vs trainer.Step\n%s", out)
	assert.Regexp(t, `(?m)^val loss \d`, string(out))
}
