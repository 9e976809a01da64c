package trainer

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
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
