package trainer

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor"
)

func moeConfig4() config.Config {
	c := smallConfig()
	c.Model.MoE.Experts, c.Model.MoE.TopK, c.Model.MoE.Every = 4, 2, 1
	c.Model.MoE.AuxLossCoef, c.Model.MoE.ZLossCoef = 0.01, 0.001
	c.Train.Steps, c.Train.LR, c.Train.LogEvery, c.Train.EvalEvery = 12, 3e-3, 4, 5
	return c
}

// runMoE trains cfg and returns the metrics file's train lines.
func runMoE(t *testing.T, cfg config.Config) []map[string]any {
	cfg.MetricsFile = filepath.Join(t.TempDir(), "metrics.jsonl")
	tr, err := New(cfg, Options{Train: corpus[:4000], Val: corpus[4000:]})
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.NoError(t, err)
	lines := trainLines(t, cfg.MetricsFile)
	require.Len(t, lines, cfg.Train.Steps)
	return lines
}

// trainLines reads the train lines of a metrics file.
func trainLines(t *testing.T, path string) []map[string]any {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var lines []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m))
		if m["kind"] == "train" {
			lines = append(lines, m)
		}
	}
	return lines
}

// A MoE GPT trains on one process; every step logs aux_loss and z_loss
// beside the language-model loss, and the steps that log a line (the
// first, every log_every-th, the last) the tokens of each expert of each
// block: every token of the step's batch twice (top-2). Dropless, nothing
// is dropped.
func TestMoETrainsAndLogs(t *testing.T) {
	cfg := moeConfig4()
	lines := runMoE(t, cfg)
	assert.Less(t, lines[len(lines)-1]["loss"].(float64), lines[0]["loss"].(float64)-0.3, "12 steps on a repetitive text must learn something")
	tokens := float64(cfg.Train.BatchSize * cfg.Train.GradAccum * cfg.Model.BlockSize * cfg.Model.MoE.TopK)
	for i, m := range lines {
		step := i + 1
		assert.Greater(t, m["aux_loss"], 0.0, "step %d", step)
		assert.Greater(t, m["z_loss"], 0.0, "step %d", step)
		assert.NotContains(t, m, "dropped_tokens", "step %d", step)
		load, logged := m["expert_load"].([]any)
		if step == 1 || step%cfg.Train.LogEvery == 0 || step == cfg.Train.Steps {
			require.True(t, logged, "step %d logs expert_load", step)
			require.Len(t, load, cfg.Model.NLayer, "one list per MoE block")
			for b, l := range load {
				var sum float64
				for _, n := range l.([]any) {
					sum += n.(float64)
				}
				assert.Len(t, l, cfg.Model.MoE.Experts)
				assert.Equal(t, tokens, sum, "step %d block %d", step, b)
			}
		} else {
			assert.False(t, logged, "step %d logs no expert_load", step)
		}
	}
}

// `loss` is the language-model loss: the first step (the same weights
// whatever the coefficients) logs the same loss with and without the
// auxiliary losses, and the later steps differ because their gradients
// trained the router.
func TestMoELossStaysLanguageModelLoss(t *testing.T) {
	with := runMoE(t, moeConfig4())
	cfg := moeConfig4()
	cfg.Model.MoE.AuxLossCoef, cfg.Model.MoE.ZLossCoef = 0, 0
	without := runMoE(t, cfg)
	assert.Equal(t, without[0]["loss"], with[0]["loss"])
	assert.NotEqual(t, without[3]["loss"], with[3]["loss"])
	assert.NotContains(t, without[0], "aux_loss")
	assert.NotContains(t, without[0], "z_loss")
}

// With a capacity (0.5: an expert takes half its fair share) assignments
// drop, the count is logged, and the run still trains.
func TestMoECapacityDropsAndTrains(t *testing.T) {
	cfg := moeConfig4()
	cfg.Model.MoE.CapacityFactor = 0.5
	lines := runMoE(t, cfg)
	for i, m := range lines {
		assert.Greater(t, m["dropped_tokens"], 0.0, "step %d", i+1)
	}
	assert.Less(t, lines[len(lines)-1]["loss"].(float64), lines[0]["loss"].(float64)-0.3)
}

// A MoE run checkpointed after step 3 and resumed there continues as the
// uninterrupted run: the same losses, auxiliary losses and expert loads,
// bit for bit (the experts and the router are parameters like any other,
// so the checkpoint holds them without a special case).
func TestMoEResumeContinuesUninterrupted(t *testing.T) {
	cfg := moeConfig4()
	cfg.Train.Steps, cfg.Train.LogEvery = 6, 1
	whole := runMoE(t, cfg)
	cfg.Checkpoint.Dir, cfg.Checkpoint.Every = filepath.Join(t.TempDir(), "ckpt"), 3
	cfg.Train.Steps = 3
	runMoE(t, cfg)
	cfg.Train.Steps, cfg.Resume = 6, filepath.Join(cfg.Checkpoint.Dir, "step-0000003")
	cfg.MetricsFile = filepath.Join(t.TempDir(), "resumed.jsonl")
	tr, err := New(cfg, Options{Train: corpus[:4000], Val: corpus[4000:]})
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.NoError(t, err)
	resumed := trainLines(t, cfg.MetricsFile)
	require.Len(t, resumed, 3, "steps 4..6")
	for i, m := range resumed {
		w := whole[3+i]
		for _, k := range []string{"step", "loss", "grad_norm", "aux_loss", "z_loss", "expert_load"} {
			assert.Equal(t, w[k], m[k], "step %v %s", w["step"], k)
		}
	}
}

// A MoE model's weights file records its experts, so `sample` rebuilds
// the model from the file alone; a dense model's file has no moe keys.
func TestMoEWeightsMetadata(t *testing.T) {
	c := nn.GPTConfig{NLayer: 2, NHead: 2, NEmbd: 16, BlockSize: 8, VocabSize: 32,
		MoE: nn.MoEConfig{Experts: 4, TopK: 2, Every: 2, CapacityFactor: 1.25}}
	m, err := nn.NewGPT(c, 1, tensor.Float32, nil)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "moe.safetensors")
	require.NoError(t, SaveWeights(m, path))
	_, meta, err := ckpt.Load(path)
	require.NoError(t, err)
	got, ok := ModelConfigFromMetadata(meta)
	require.True(t, ok, "%v", meta)
	assert.Equal(t, c, got)
	c.MoE = nn.MoEConfig{}
	assert.NotContains(t, weightsMeta(c), "moe.experts")
}
