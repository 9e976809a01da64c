package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/trace"
	"github.com/tinyacc/tinyacc/pluginsdk"
)

// TestDDPProcessMatchesCompiled trains with DDP compiled in and with
// ddp.process: true (DDP's bucketed all-reduce in a plugin process per
// rank, gradients through shared memory) on 2 and 4 ranks, as goroutine
// ranks and as real processes, and requires the saved weights to be equal
// byte for byte. The traces tell the two apart: compiled DDP all-reduces
// its buckets in the training process (its spans are in the trace), the
// plugin process outside it, so a run that ignored ddp.process would show
// them. Afterwards no arena file of any run is left.
func TestDDPProcessMatchesCompiled(t *testing.T) {
	dir := t.TempDir()
	bin := tinyaccBinary(t)
	before, _ := filepath.Glob(filepath.Join(pluginsdk.ShmDir, "tinyacc-*-ddp"))
	common := []string{"train", "--model.n_layer=2", "--model.n_embd=32", "--model.block_size=16",
		"--train.steps=3", "--train.batch_size=2", "--train.eval_every=0", "--data.max_bytes=100000",
		"--ddp.bucket_mb=0.01", "--ddp.first_bucket_mb=0.004"}
	// save trains, and returns the saved weights and the number of bucket
	// all-reduce spans in the run's trace.
	save := func(name string, extra ...string) ([]byte, int) {
		path := filepath.Join(dir, name+".safetensors")
		tracePath := filepath.Join(dir, name+".trace.json")
		cmd := exec.Command(bin, append(append(append([]string{}, common...), "--save_to="+path, "--trace="+tracePath), extra...)...)
		cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
		b, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s:\n%s", name, b)
		w, err := os.ReadFile(path)
		require.NoError(t, err)
		tb, err := os.ReadFile(tracePath)
		require.NoError(t, err)
		var doc struct {
			TraceEvents []trace.Event `json:"traceEvents"`
		}
		require.NoError(t, json.Unmarshal(tb, &doc), name)
		buckets := 0
		for _, e := range doc.TraceEvents {
			if strings.HasPrefix(e.Name, "all_reduce bucket ") {
				buckets++
			}
		}
		return w, buckets
	}
	for _, n := range []int{2, 4} {
		for _, ranks := range []string{"--local-ranks", "--nproc"} {
			name := ranks[2:] + strconv.Itoa(n)
			want, inHost := save(name+"-compiled", ranks, strconv.Itoa(n))
			got, inPlugin := save(name+"-process", ranks, strconv.Itoa(n), "--ddp.process=true")
			require.Equal(t, want, got, "%s %d: weights of DDP compiled and as a process", ranks, n)
			require.Positive(t, inHost, "%s %d: compiled DDP's bucket all-reduces in the trace", ranks, n)
			require.Zero(t, inPlugin, "%s %d: bucket all-reduces in the training process's trace with ddp.process=true (DDP ran compiled in)", ranks, n)
		}
	}
	after, _ := filepath.Glob(filepath.Join(pluginsdk.ShmDir, "tinyacc-*-ddp"))
	require.Equal(t, before, after, "no arena file outlives its run")
}
