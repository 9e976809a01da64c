package trainer

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/config"
)

// TestKillDuringSave kills a training process with SIGKILL in the middle
// of writing its second checkpoint: the first stays complete, verified,
// and the latest pointer names it; a resumed run continues from it.
func TestKillDuringSave(t *testing.T) {
	cfg := smallConfig()
	cfg.Train.Steps, cfg.Train.EvalEvery = 4, 0
	if dir := os.Getenv("TINYACC_TEST_KILL_DIR"); dir != "" {
		cfg.Checkpoint.Dir, cfg.Checkpoint.Every = dir, 2
		checkpointHook = func(step int) {
			if step == 4 {
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
		}
		tr, err := New(cfg, Options{Train: corpus[:4000]})
		require.NoError(t, err)
		_, err = tr.Run(context.Background())
		require.NoError(t, err)
		return
	}
	dir := filepath.Join(t.TempDir(), "ckpt")
	cmd := exec.Command(os.Args[0], "-test.run=^TestKillDuringSave$", "-test.count=1")
	cmd.Env = append(os.Environ(), "TINYACC_TEST_KILL_DIR="+dir)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "the child must have been killed: %s", out)
	require.Equal(t, "signal: killed", ee.Error())

	latest, err := os.ReadFile(filepath.Join(dir, ckpt.LatestFile))
	require.NoError(t, err)
	require.Equal(t, ckpt.StepDir(2), strings.TrimSpace(string(latest)))
	ix, err := ckpt.ReadIndex(filepath.Join(dir, ckpt.StepDir(2)))
	require.NoError(t, err)
	require.NoError(t, ix.Verify(filepath.Join(dir, ckpt.StepDir(2))))
	_, err = os.Stat(filepath.Join(dir, ckpt.StepDir(4)))
	require.True(t, os.IsNotExist(err), "no step-4 checkpoint may look complete")

	want := runLosses(t, cfg)
	cfg.Checkpoint.Dir, cfg.Resume = dir, "auto"
	var got []float64
	tr, err := New(cfg, Options{Train: corpus[:4000], Val: corpus[4000:], OnStep: func(m StepMetrics) { got = append(got, m.Loss) }})
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, want[2:], got)
}

func TestUnwritableOutputsAreRefusedBeforeTraining(t *testing.T) {
	// A path under a regular file cannot be created, even by root.
	file := filepath.Join(t.TempDir(), "a-file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	for _, c := range []struct {
		set  func(cfg *config.Config)
		want string
	}{
		{func(cfg *config.Config) { cfg.SaveTo = filepath.Join(file, "w.safetensors") }, "save_to: cannot create " + file + ": mkdir " + file + ": not a directory"},
		{func(cfg *config.Config) { cfg.Checkpoint.Dir = filepath.Join(file, "ckpt") }, "checkpoint.dir: cannot create " + filepath.Join(file, "ckpt") + ": mkdir " + file + ": not a directory"},
		{func(cfg *config.Config) { cfg.Trace = filepath.Join(file, "t.json") }, "trace: cannot create " + file + ": mkdir " + file + ": not a directory"},
	} {
		cfg := smallConfig()
		c.set(&cfg)
		_, err := New(cfg, Options{Train: corpus[:4000]})
		require.EqualError(t, err, c.want)
	}
}
