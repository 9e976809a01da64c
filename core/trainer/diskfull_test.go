//go:build linux

package trainer

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// tmpfs mounts a file system of size bytes for the test: a real full disk.
func tmpfs(t *testing.T, size string) string {
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v); TestMetricsWriteFailureStopsAtOnce covers a failing writer", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, 0) })
	return dir
}

func TestMetricsFullDiskStopsAtTheStep(t *testing.T) {
	dir := tmpfs(t, "4k")
	cfg := smallConfig()
	cfg.Train.Steps, cfg.Train.EvalEvery = 100, 0
	cfg.MetricsFile = filepath.Join(dir, "m.jsonl")
	steps := 0
	tr, err := New(cfg, Options{Train: corpus[:4000], Val: corpus[4000:], OnStep: func(StepMetrics) { steps++ }})
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.EqualError(t, err, "trainer: metrics_file "+cfg.MetricsFile+": write "+cfg.MetricsFile+": no space left on device")
	rows := readMetrics(t, cfg.MetricsFile) // every line whole
	require.Equal(t, steps-1, len(rows), "the run stops at the step whose record did not fit")
	require.Equal(t, float64(steps-1), rows[len(rows)-1]["step"])
	b, err := os.ReadFile(cfg.MetricsFile)
	require.NoError(t, err)
	require.True(t, strings.HasSuffix(string(b), "}\n"))
}

func TestSaveFullDiskLeavesOldFileAndNoTemp(t *testing.T) {
	dir := tmpfs(t, "16k")
	cfg := smallConfig()
	cfg.Train.Steps = 1
	cfg.SaveTo = filepath.Join(dir, "w.safetensors")
	require.NoError(t, os.WriteFile(cfg.SaveTo, []byte("old"), 0o644))
	tr, err := New(cfg, Options{Train: corpus[:4000], Val: corpus[4000:]})
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.ErrorContains(t, err, `save_to: ckpt: save "`+cfg.SaveTo+`": writing `+dir+"/.w.safetensors.tmp-")
	require.ErrorContains(t, err, "no space left on device")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "only the old file")
	b, err := os.ReadFile(cfg.SaveTo)
	require.NoError(t, err)
	require.Equal(t, "old", string(b))
}

// TestCheckpointFullDiskLeavesNoPartialDir: a checkpoint that does not fit
// fails the run and leaves no partial directory; a later run writing into
// the directory removes the one a killed save left, and says so.
func TestCheckpointFullDiskLeavesNoPartialDir(t *testing.T) {
	dir := tmpfs(t, "64k")
	cfg := smallConfig()
	cfg.Train.Steps, cfg.Train.EvalEvery = 2, 0
	cfg.Checkpoint.Dir, cfg.Checkpoint.Every = filepath.Join(dir, "ckpt"), 1
	tr, err := New(cfg, Options{Train: corpus[:4000]})
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.ErrorContains(t, err, `checkpoint: ckpt: save "`+filepath.Join(cfg.Checkpoint.Dir, ".step-0000001.tmp", "model-r00000.safetensors")+`": `)
	require.ErrorContains(t, err, "no space left on device")
	entries, err := os.ReadDir(cfg.Checkpoint.Dir)
	require.NoError(t, err)
	require.Empty(t, entries, "nothing of the failed checkpoint is left")

	// What a save killed midway leaves, and what is not a checkpoint's.
	ckptDir := filepath.Join(t.TempDir(), "ckpt")
	partial := filepath.Join(ckptDir, ".step-0000004.tmp")
	require.NoError(t, os.MkdirAll(partial, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(partial, "model-r00000.safetensors"), []byte("half"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(ckptDir, ".notes.tmp"), 0o755))
	cfg.Checkpoint.Dir, cfg.Checkpoint.Every = ckptDir, 0
	var log strings.Builder
	tr, err = New(cfg, Options{Train: corpus[:4000], Log: &log})
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.NoError(t, err)
	require.Contains(t, log.String(), "tinyacc: removed "+partial+", a checkpoint an earlier run did not complete\n")
	var names []string
	entries, err = os.ReadDir(ckptDir)
	require.NoError(t, err)
	for _, e := range entries {
		names = append(names, e.Name())
	}
	require.Equal(t, []string{".notes.tmp", "latest", "step-0000002"}, names)
}
