package trainer

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/ckpt"
)

// rowsOf returns the steps of the rows of kind in a metrics file, in order.
func rowsOf(t *testing.T, path, kind string) []int {
	var steps []int
	for _, r := range readMetrics(t, path) {
		if r["kind"] == kind {
			steps = append(steps, int(r["step"].(float64)))
		}
	}
	return steps
}

func upTo(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i + 1
	}
	return out
}

// TestMetricsKeepTheHistoryAcrossResume resumes a 10-step run from its
// checkpoint after step 4 (steps 5..10 are replayed), then extends it to
// 12 steps: metrics_file holds one train row per step 1..12, no duplicate
// and no gap, the rows of steps 1..4 as the first run wrote them, and a
// line a killed run left half written is dropped.
func TestMetricsKeepTheHistoryAcrossResume(t *testing.T) {
	dir := t.TempDir()
	cfg := smallConfig()
	cfg.Train.Steps, cfg.Train.EvalEvery = 10, 3
	cfg.Checkpoint.Dir, cfg.Checkpoint.Every = filepath.Join(dir, "ckpt"), 4
	cfg.MetricsFile = filepath.Join(dir, "m.jsonl")
	run := func() {
		tr, err := New(cfg, Options{Train: corpus[:4000], Val: corpus[4000:]})
		require.NoError(t, err)
		_, err = tr.Run(context.Background())
		require.NoError(t, err)
	}
	run()
	first := readMetrics(t, cfg.MetricsFile)
	require.Equal(t, upTo(10), rowsOf(t, cfg.MetricsFile, "train"))
	f, err := os.OpenFile(cfg.MetricsFile, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.WriteString(`{"kind":"train","step":11,"lo`)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	cfg.Resume = filepath.Join(cfg.Checkpoint.Dir, ckpt.StepDir(4))
	run()
	require.Equal(t, upTo(10), rowsOf(t, cfg.MetricsFile, "train"))
	require.Equal(t, []int{3, 6, 9, 10}, rowsOf(t, cfg.MetricsFile, "eval"))
	again := readMetrics(t, cfg.MetricsFile)
	require.Equal(t, first[:5], again[:5], "steps 1..4 and the eval after step 3 are kept as written")

	cfg.Resume, cfg.Train.Steps = "auto", 12
	run()
	require.Equal(t, upTo(12), rowsOf(t, cfg.MetricsFile, "train"))
	require.Equal(t, []int{3, 6, 9, 10, 12}, rowsOf(t, cfg.MetricsFile, "eval"))

	// A fresh run (nothing to resume) starts the file anew.
	cfg.Resume, cfg.Checkpoint.Dir, cfg.Train.Steps = "", "", 3
	run()
	require.Equal(t, upTo(3), rowsOf(t, cfg.MetricsFile, "train"))
}

// TestMetricsRefuseADamagedHistory: a line in the middle that is not a
// record is refused, naming it, rather than dropped with its step.
func TestMetricsRefuseADamagedHistory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.jsonl")
	require.NoError(t, os.WriteFile(path, []byte("{\"kind\":\"train\",\"step\":1}\nxx\n{\"kind\":\"train\",\"step\":2}\n"), 0o644))
	_, err := OpenMetricsWriter(path, 2)
	require.EqualError(t, err, "trainer: metrics_file "+path+": line 2 is not a metrics record: invalid character 'x' looking for beginning of value (move the file away to start a new one)")
}
