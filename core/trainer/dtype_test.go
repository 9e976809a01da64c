package trainer_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// train.dtype float64 trains every tensor in float64 (parameters, their
// gradients, the optimizer's moments), the checkpoint holds float64 and
// the export writes it; a float32 run cannot continue that checkpoint and
// is told which key differs.
func TestFloat64Training(t *testing.T) {
	cfg := ptest.Config64()
	cfg.Train.Steps = 2
	cfg.Checkpoint.Dir = t.TempDir()
	tr, err := trainer.New(cfg, trainer.Options{Train: ptest.Corpus()})
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.NoError(t, err)
	for _, p := range tr.Model.Params() {
		require.Equal(t, tensor.Float64, p.DType(), p.Name)
		require.Equal(t, tensor.Float64, p.Grad.DType(), p.Name)
	}
	dir := filepath.Join(cfg.Checkpoint.Dir, ckpt.StepDir(2))
	ix, err := ckpt.ReadIndex(dir)
	require.NoError(t, err)
	require.NotEmpty(t, ix.Tensors)
	for name, ti := range ix.Tensors {
		require.Equal(t, "float64", ti.DType, name)
		require.NotEmpty(t, ti.State, "%s: the optimizer state is saved", name)
	}
	out := filepath.Join(t.TempDir(), "model.safetensors")
	require.NoError(t, trainer.ExportCheckpoint(dir, out))
	r, err := ckpt.Open(out)
	require.NoError(t, err)
	wte := tensor.New(tensor.Float64, r.Numel("wte.weight"))
	require.NoError(t, r.Read("wte.weight", wte), "the export is float64")
	require.NoError(t, r.Close())
	require.Equal(t, tr.Model.Param("wte.weight").Float64s(), wte.Float64s())

	f32 := cfg
	f32.Train.DType, f32.Train.Steps, f32.Resume = "float32", 3, dir
	tr, err = trainer.New(f32, trainer.Options{Train: ptest.Corpus()})
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.EqualError(t, err, `resume: the checkpoint cannot continue this run: train.dtype is "float32" here but "float64" in the checkpoint`)
}

// In float64, one process accumulating 8 micro-batches of 1 is the step of
// one batch of 8 to 1e-9, on a model (4 layers, 64 wide) where float32
// noise alone reaches ~2e-4 on the weights.
func TestFloat64GradAccumMatchesOneBigBatch(t *testing.T) {
	big := ptest.Config64()
	big.Train.BatchSize, big.Train.GradAccum = 8, 1
	acc := big
	acc.Train.BatchSize, acc.Train.GradAccum = 1, 8
	want := ptest.Single(t, big)
	w := ptest.AssertEquivalent(t, want, ptest.Single(t, acc), "grad_accum 8 against 1")
	t.Logf("grad_accum 8 against 1 [float64]: %s", w)
}
