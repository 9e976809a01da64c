package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTrainNprocEvaluationMatchesOneProcess: two real rank processes
// (`tinyacc train --nproc 2`, data parallel over tcp) split every
// evaluation batch as they split a training batch, so their `eval` rows
// are one process's on the same global batch.
func TestTrainNprocEvaluationMatchesOneProcess(t *testing.T) {
	dir := t.TempDir()
	bin := tinyaccBinary(t)
	common := []string{"train", "--model.n_layer=2", "--model.n_embd=32", "--model.block_size=32",
		"--train.steps=4", "--train.eval_every=2", "--train.eval_batches=2", "--data.max_bytes=200000", "--data.val_fraction=0.1"}
	run := func(name string, extra ...string) []float64 {
		return metricLosses(t, trainRun(t, bin, dir, name, append(append([]string{}, common...), extra...)...), "eval")
	}
	want := run("single", "--train.batch_size=8")
	require.Len(t, want, 2)
	got := run("nproc", "--nproc", "2", "--train.batch_size=2", "--train.grad_accum=2")
	require.Len(t, got, len(want))
	for i := range want {
		require.InEpsilon(t, want[i], got[i], 1e-5, "evaluation %d", i)
	}
}
