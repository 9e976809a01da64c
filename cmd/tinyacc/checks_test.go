package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// An 8 KB file of 4000 "?" lines used to take the YAML library 20 seconds
// and print a 450 MB error; `config show` now refuses it with one line.
func TestConfigShowPathologicalYAML(t *testing.T) {
	path := filepath.Join(t.TempDir(), "q.yaml")
	require.NoError(t, os.WriteFile(path, []byte(strings.Repeat("?\n", 4000)), 0o644))
	code, _, stderr := runCLI("config", "show", "--config", path)
	require.Equal(t, 1, code)
	require.Equal(t, `tinyacc: config: reading config file "`+path+`": yaml: line 2: mapping key "" already defined at line 1`+"\n", stderr)
}

// A parallel layout that does not match the ranks is refused before any
// rank starts or any data is read, in one process too.
func TestParallelLayoutCheckedBeforeWork(t *testing.T) {
	code, stdout, stderr := runCLI("train", "--parallel.dp=2")
	require.Equal(t, 1, code)
	require.Empty(t, stdout, "nothing ran")
	require.Equal(t, "tinyacc: config: parallel.dp=2 × tp=1 × pp=1 × cp=1 needs 2 ranks, but the job has 1; set parallel.dp=1, or 0 to use every rank\n", stderr)

	for _, flag := range []string{"--nproc", "--local-ranks"} {
		code, stdout, stderr = runCLI("train", flag, "2", "--parallel.dp=3")
		require.Equal(t, 1, code)
		require.Empty(t, stdout, "no rank started")
		require.Equal(t, "tinyacc: config: parallel.dp=3 × tp=1 × pp=1 × cp=1 needs 3 ranks, but the job has 2; set parallel.dp=2, or 0 to use every rank\n", stderr)
	}
}

func TestReservedVariablesChecked(t *testing.T) {
	t.Setenv("TINYACC_SHM", "maybe")
	t.Setenv("TINYACC_DEBUG", "yes")
	code, _, stderr := runCLI("train", "--train.steps=1")
	require.Equal(t, 1, code)
	require.Equal(t, `tinyacc: config: TINYACC_SHM="maybe" is not one of "0", "1", "true", "false" (or unset)`+"\n"+
		`config: TINYACC_DEBUG="yes" is not one of "0", "off", "detail" (or unset)`+"\n", stderr)
}

func TestSampleRefusesBadSettings(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "never-read.safetensors")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--tokens", "-5"}, "tokens=-5 must be >= 1"},
		{[]string{"--tokens", "0"}, "tokens=0 must be >= 1"},
		{[]string{"--temperature", "-1"}, "temperature=-1 must be a finite number >= 0 (0 = greedy)"},
		{[]string{"--temperature", "NaN"}, "temperature=NaN must be a finite number >= 0 (0 = greedy)"},
		{[]string{"--top_k", "-1"}, "top_k=-1 must be >= 0 (0 = all tokens)"},
	} {
		code, _, stderr := runCLI(append([]string{"sample", "--from", missing}, c.args...)...)
		require.Equal(t, 1, code, c.args)
		require.Equal(t, "tinyacc: sample: --"+c.want+"\n", stderr, "checked before the file is read")
	}
}
