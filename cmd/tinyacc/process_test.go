package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/pluginsdk"
)

// TestDDPProcessMatchesCompiled trains with DDP compiled in and with
// ddp.process: true (DDP's bucketed all-reduce in a plugin process per
// rank, gradients through shared memory) on 2 and 4 ranks, as goroutine
// ranks and as real processes, and requires the saved weights to be equal
// byte for byte. Afterwards no arena file of any run is left.
func TestDDPProcessMatchesCompiled(t *testing.T) {
	dir := t.TempDir()
	bin := tinyaccBinary(t)
	before, _ := filepath.Glob(filepath.Join(pluginsdk.ShmDir, "tinyacc-*-ddp"))
	common := []string{"train", "--model.n_layer=2", "--model.n_embd=32", "--model.block_size=16",
		"--train.steps=3", "--train.batch_size=2", "--train.eval_every=0", "--data.max_bytes=100000",
		"--ddp.bucket_mb=0.01", "--ddp.first_bucket_mb=0.004"}
	save := func(name string, extra ...string) []byte {
		path := filepath.Join(dir, name+".safetensors")
		cmd := exec.Command(bin, append(append(append([]string{}, common...), "--save_to="+path), extra...)...)
		cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
		b, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s:\n%s", name, b)
		w, err := os.ReadFile(path)
		require.NoError(t, err)
		return w
	}
	for _, n := range []int{2, 4} {
		for _, ranks := range []string{"--local-ranks", "--nproc"} {
			name := ranks[2:] + strconv.Itoa(n)
			want := save(name+"-compiled", ranks, strconv.Itoa(n))
			got := save(name+"-process", ranks, strconv.Itoa(n), "--ddp.process=true")
			require.Equal(t, want, got, "%s %d: weights of DDP compiled and as a process", ranks, n)
		}
	}
	after, _ := filepath.Glob(filepath.Join(pluginsdk.ShmDir, "tinyacc-*-ddp"))
	require.Equal(t, before, after, "no arena file outlives its run")
}
