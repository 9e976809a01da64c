package trainer

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// TestNoWeightSizedTemporaries holds the activation peak of a step at
// batch 1, where the weights dwarf the activations, to the activation
// estimate (what backward saves and one op's working buffers) plus one
// block's largest weight (c_fc, 4·C·C): gradients accumulate in place
// into the parameters' Grad, so no temporary the size of the model's
// weights, nor of the tied embedding table (V·C, twice c_fc here), may
// sit beside the activations. The second micro-batch accumulates into
// gradients that already hold the first's.
func TestNoWeightSizedTemporaries(t *testing.T) {
	for _, accum := range []int{1, 2} {
		t.Run(fmt.Sprintf("grad_accum %d", accum), func(t *testing.T) {
			cfg := smallConfig()
			cfg.Model.NLayer, cfg.Model.NHead, cfg.Model.NEmbd, cfg.Model.BlockSize, cfg.Model.VocabSize = 2, 2, 128, 8, 1024
			cfg.Train.BatchSize, cfg.Train.GradAccum, cfg.Train.Steps, cfg.Train.EvalEvery = 1, accum, 2, 0
			tr, err := New(cfg, Options{Train: corpus})
			require.NoError(t, err)
			res, err := tr.Run(context.Background())
			require.NoError(t, err)
			m := GPTConfig(cfg)
			est := ActivationBytes(cfg, m, ActLayout{})
			layer := int64(4 * 4 * m.NEmbd * m.NEmbd)
			weights := 4 * m.NumParams()
			got := res.Memory[0].ActPeak
			t.Logf("activation peak %d, estimate %d, one block's largest weight %d, all weights %d", got, est, layer, weights)
			require.Greater(t, weights, 4*est, "the test needs weights that dwarf the activations")
			require.LessOrEqual(t, got, est+layer, "activations hold a weight-sized temporary")
		})
	}
}

// TestVerifyWeightsHoldsNoCopy: before loading a weights file into live
// parameters, LoadWeights reads every value of the parts a rank holds to
// refuse a non-finite one. A part held as one flat run (ZeRO's shards)
// is read in bounded chunks into one reused buffer, never copied whole
// onto the Go heap, where the allocator would not count it: checking a
// 4 MiB table as a single run allocates less than half of it.
func TestVerifyWeightsHoldsNoCopy(t *testing.T) {
	cfg := smallConfig()
	cfg.Model.NLayer, cfg.Model.NHead, cfg.Model.NEmbd, cfg.Model.BlockSize, cfg.Model.VocabSize = 1, 2, 64, 8, 16384
	m, err := BuildModel(cfg, nil)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "w.safetensors")
	require.NoError(t, SaveWeights(m, path))
	w, err := openWeights(path, m.Config)
	require.NoError(t, err)
	defer w.Close()
	var table *tensor.Tensor
	for _, p := range m.Params() {
		if table == nil || p.Numel() > table.Numel() {
			table = p
		}
	}
	spec := place.NewSpec(table.Name, []int{table.Numel()})
	spec.Along[place.DP] = place.Placement{Kind: place.Flat, Offset: 0, Length: table.Numel()}
	bytes := int64(4 * table.Numel())
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	require.NoError(t, w.verify(spec, place.Single, tensor.Float32))
	runtime.ReadMemStats(&after)
	got := int64(after.TotalAlloc - before.TotalAlloc)
	t.Logf("checking %s (%d bytes) as one run allocated %d bytes on the Go heap", table.Name, bytes, got)
	require.Less(t, got, bytes/2, "verify copies the part outside the allocator")
}
