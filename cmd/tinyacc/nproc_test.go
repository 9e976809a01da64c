package main

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTrainNprocMatchesOneProcess runs real rank processes through
// `tinyacc train --nproc 2` (the launcher, the tcp backend, the plugins the
// config selects) and holds their losses to one process with the same
// global batch.
func TestTrainNprocMatchesOneProcess(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "tinyacc")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	common := []string{"train", "--model.n_layer=2", "--model.n_embd=32", "--model.block_size=32",
		"--train.steps=6", "--train.eval_every=0", "--data.max_bytes=200000", "--data.val_fraction=0"}
	run := func(name string, extra ...string) []float64 {
		metrics := filepath.Join(dir, name+".jsonl")
		args := append(append(append([]string{}, common...), "--metrics_file="+metrics), extra...)
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
		b, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s %v:\n%s", name, extra, b)
		return trainLosses(t, metrics)
	}
	want := run("single", "--train.batch_size=8")
	for _, v := range [][]string{{"--zero.stage=0", "--ddp.mode=bucketed"}, {"--zero.stage=3"}} {
		got := run("nproc", append([]string{"--nproc", "2", "--train.batch_size=4"}, v...)...)
		require.Len(t, got, len(want))
		for i := range want {
			require.InEpsilon(t, want[i], got[i], 1e-5, "%v: loss of step %d", v, i)
		}
	}
}

func trainLosses(t *testing.T, path string) []float64 {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var losses []float64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m struct {
			Kind string  `json:"kind"`
			Loss float64 `json:"loss"`
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m))
		if m.Kind == "train" {
			losses = append(losses, m.Loss)
		}
	}
	return losses
}
