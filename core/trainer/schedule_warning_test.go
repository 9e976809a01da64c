package trainer

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/ckpt"
)

// TestResumeLongerRunWarnsOnce: resuming with a larger train.steps says
// once how the cosine schedule changes (old and new span, the next step's
// lr under each: 3e-5 + 0.5·(1+cos(0.4π))·2.7e-4 on the new one) and trains on; resuming with the same train.steps says
// nothing.
func TestResumeLongerRunWarnsOnce(t *testing.T) {
	dir := t.TempDir()
	cfg := smallConfig()
	cfg.Train.Steps, cfg.Train.EvalEvery = 4, 0
	cfg.Checkpoint.Dir = dir
	tr, err := New(cfg, Options{Train: corpus[:4000], Val: corpus[4000:]})
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.NoError(t, err)

	run := func(steps int) (string, *Result) {
		c := cfg
		c.Train.Steps, c.Resume, c.Checkpoint.Dir = steps, filepath.Join(dir, ckpt.StepDir(4)), ""
		var log bytes.Buffer
		tr, err := New(c, Options{Train: corpus[:4000], Val: corpus[4000:], Log: &log})
		require.NoError(t, err)
		res, err := tr.Run(context.Background())
		require.NoError(t, err)
		return log.String(), res
	}
	out, res := run(8)
	require.Equal(t, 4, res.StepsRun, "the run continues")
	want := "tinyacc: warning: train.steps is 8 here but was 4 in the run that wrote " + filepath.Join(dir, ckpt.StepDir(4)) +
		": the cosine schedule (lr 3.00e-04 to 3.00e-05 after 2 warm-up steps) now spans 8 steps instead of 4, so step 5's lr is 2.07e-04, not 3.00e-05; continuing\n"
	require.Contains(t, out, want)
	require.Equal(t, 1, strings.Count(out, "warning"))

	out, _ = run(4)
	require.NotContains(t, out, "warning")
}
