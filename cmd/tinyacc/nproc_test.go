package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTrainNprocMatchesOneProcess runs real rank processes through
// `tinyacc train --nproc 2` (the launcher, the tcp backend, the plugins the
// config selects) and holds their losses to one process with the same
// global batch.
func TestTrainNprocMatchesOneProcess(t *testing.T) {
	dir := t.TempDir()
	bin := tinyaccBinary(t)
	common := []string{"train", "--model.n_layer=2", "--model.n_embd=32", "--model.block_size=32",
		"--train.steps=6", "--train.eval_every=0", "--data.max_bytes=200000", "--data.val_fraction=0"}
	run := func(name string, extra ...string) []float64 {
		return trainLosses(t, trainRun(t, bin, dir, name, append(append([]string{}, common...), extra...)...))
	}
	want := run("single", "--train.batch_size=8")
	for _, v := range [][]string{{"--zero.stage=0", "--ddp.mode=bucketed", "--train.batch_size=4"}, {"--zero.stage=3", "--train.batch_size=4", "--trace=" + filepath.Join(dir, "z3.json")},
		{"--parallel.tp=2", "--tp.sequence_parallel=true", "--train.batch_size=8"}} {
		got := run("nproc", append([]string{"--nproc", "2"}, v...)...)
		require.Len(t, got, len(want))
		for i := range want {
			require.InEpsilon(t, want[i], got[i], 1e-5, "%v: loss of step %d", v, i)
		}
	}
	// Rank 0 merged both processes' traces into one file.
	requireMergedTrace(t, filepath.Join(dir, "z3.json"), 2, 6)
}

// `tinyacc bench layouts` runs every layout as processes and holds the
// bytes each sends to its formula (it fails beyond 1%): one table, one row
// per layout; in float32 and under --precision bf16, where activations
// travel in 2 bytes and the formula's activation terms halve, as do
// ZeRO's parameter gathers (the 2-byte copies). The MoE rows (ep 2, and
// ep 2 × tp 2 on 4 processes, whose experts each all-reduce their rows
// over the tp group) are held step by step to their routing's formula.
func TestBenchLayouts(t *testing.T) {
	bin := tinyaccBinary(t)
	for _, precision := range []string{"no", "bf16"} {
		cmd := exec.Command(bin, "bench", "layouts", "--nproc", "2", "--steps", "3", "--repeats", "1", "--precision", precision,
			"--n_layer", "4", "--n_embd", "32", "--block_size", "16", "--batch", "8")
		cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		require.NoError(t, cmd.Run(), "%s", stderr.String())
		lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
		require.Len(t, lines, 2+len(layoutRows)+2, stdout.String())
		require.Contains(t, lines[0], "mixed precision "+precision)
		for i, name := range []string{"1 process", "dp 2", "zero-1 dp 2", "zero-3 dp 2", "tp 2", "tp 2 + SP", "pp 2 afab", "pp 2 1f1b", "pp 2 interleaved", "pp 2 zb1", "cp 2 ring", "cp 2 allgather", "ep 2 MoE", "ep 2 x tp 2 MoE"} {
			row := lines[2+i]
			require.True(t, strings.HasPrefix(row, name), row)
			if i > 0 {
				require.Contains(t, row, " +0.000% ", "%s: measured bytes equal the formula at N = 2: %s", precision, row)
			}
		}
	}
}

// trainRun runs bin with args (a `train` command line) and a metrics file
// named after name in dir, one thread per process, and returns the metrics
// file's path.
func trainRun(t *testing.T, bin, dir, name string, args ...string) string {
	metrics := filepath.Join(dir, name+".jsonl")
	cmd := exec.Command(bin, append(append([]string{}, args...), "--metrics_file="+metrics)...)
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %v:\n%s", name, args, b)
	return metrics
}

// trainLosses reads the loss of every step of a metrics file.
func trainLosses(t *testing.T, path string) []float64 {
	return metricLosses(t, path, "train")
}

// metricLosses reads the loss of every line of kind ("train" or "eval")
// of a metrics file.
func metricLosses(t *testing.T, path, kind string) []float64 {
	lines, err := readMetrics(path)
	require.NoError(t, err)
	var losses []float64
	for _, m := range lines {
		if m.Kind == kind {
			losses = append(losses, m.Loss)
		}
	}
	return losses
}
