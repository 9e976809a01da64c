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

// Tensor-parallel layouts the model or the job cannot take are refused
// before any rank starts, naming the numbers.
func TestTensorParallelConfigCheckedBeforeWork(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--nproc", "2", "--parallel.tp=2", "--model.n_head=3", "--model.n_embd=96"},
			"config: model.n_head=3 is not divisible by parallel.tp=2: tensor parallel gives every rank the same number of heads; choose n_head a multiple of tp"},
		{[]string{"--local-ranks", "3", "--parallel.tp=3", "--model.n_head=2", "--model.n_embd=128"},
			"config: model.n_head=2 is not divisible by parallel.tp=3: tensor parallel gives every rank the same number of heads; choose n_head a multiple of tp\n" +
				"config: model.n_embd=128 is not divisible by parallel.tp=3: tensor parallel splits the width; choose n_embd a multiple of tp"},
		{[]string{"--nproc", "2", "--parallel.tp=4"},
			"config: parallel.tp=4 × pp=1 × cp=1 needs at least 4 ranks, but the job has 2: lower them or start more ranks (--nproc 4)"},
		{[]string{"--parallel.tp=2"},
			"config: parallel.tp=2 × pp=1 × cp=1 needs at least 2 ranks, but the job has 1: lower them or start more ranks (--nproc 2)"},
		{[]string{"--nproc", "2", "--parallel.tp=2", "--tp.sequence_parallel=true", "--model.block_size=127"},
			"config: model.block_size=127 is not divisible by parallel.tp=2: tp.sequence_parallel splits the sequence over the tp ranks; choose block_size a multiple of tp or set tp.sequence_parallel=false"},
	} {
		code, stdout, stderr := runCLI(append([]string{"train"}, c.args...)...)
		require.Equal(t, 1, code, c.args)
		require.Empty(t, stdout, "%v: no rank started", c.args)
		require.Equal(t, "tinyacc: "+c.want+"\n", stderr, c.args)
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

// A world size the environment gets wrong is refused before any work,
// naming the variable; it is never trained as one process.
func TestBadWorldEnvironmentRefused(t *testing.T) {
	for _, c := range []struct {
		env  [][2]string
		want string
	}{
		{[][2]string{{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "comm: WORLD_SIZE=0: the world size must be at least 1 (from torchrun)"},
		{[][2]string{{"RANK", "0"}, {"WORLD_SIZE", "-2"}}, "comm: WORLD_SIZE=-2: the world size must be at least 1 (from torchrun)"},
		{[][2]string{{"WORLD_SIZE", "0"}}, "comm: RANK and WORLD_SIZE must be set together (found only one)"},
		{[][2]string{{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}},
			"comm: LOCAL_RANK=2 is outside LOCAL_WORLD_SIZE=2: local ranks on a host are 0 to 1 (from torchrun)"},
	} {
		for _, kv := range c.env {
			t.Setenv(kv[0], kv[1])
		}
		code, stdout, stderr := runCLI("train", "--train.steps=1")
		require.Equal(t, 1, code, c.env)
		require.Empty(t, stdout, "%v: nothing trained", c.env)
		require.Equal(t, "tinyacc: "+c.want+"\n", stderr, c.env)
		for _, kv := range c.env {
			os.Unsetenv(kv[0])
		}
	}
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

// A run whose estimate exceeds memory.limit is refused before any rank
// starts, with a second line naming the layouts of the same ranks that
// the estimate says fit; a run under its limit starts.
func TestMemoryLimitRefusesBeforeWork(t *testing.T) {
	code, stdout, stderr := runCLI("train", "--nproc", "4", "--model.n_layer=8", "--model.n_embd=256", "--model.n_head=4",
		"--model.block_size=16", "--train.batch_size=1", "--data.max_bytes=65536", "--memory.limit=360MiB")
	require.Equal(t, 1, code)
	require.Empty(t, stdout, "no rank started")
	lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
	require.Len(t, lines, 2, stderr)
	require.True(t, strings.HasPrefix(lines[0], "tinyacc: memory: rank 0 needs about "), lines[0])
	require.Contains(t, lines[0], "but the limit is 90.0 MiB per rank (360.0 MiB shared by 4 ranks on this host) from memory.limit=360MiB")
	require.True(t, strings.HasPrefix(lines[1], "fits: "), lines[1])
	require.Contains(t, lines[1], "parallel.tp=4 (")
	require.NotContains(t, lines[1], "zero.stage=1 (", "ZeRO-1 keeps every parameter and gradient on every rank")

	code, stdout, stderr = runCLI("train", "--model.n_layer=1", "--model.n_embd=32", "--model.block_size=16",
		"--train.steps=1", "--train.eval_every=0", "--data.max_bytes=65536", "--memory.limit=2GiB")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "step 1/1")
}
