package trainer

import (
	"bufio"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/data"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor"
)

func smallConfig() config.Config {
	c := config.Defaults()
	c.Model.NLayer, c.Model.NHead, c.Model.NEmbd, c.Model.BlockSize = 2, 2, 32, 32
	c.Train.Steps, c.Train.BatchSize = 6, 4
	c.Train.EvalEvery, c.Train.EvalBatches = 3, 2
	c.Train.WarmupSteps = 2
	return c
}

var corpus = data.Encode(strings.Repeat(refText, 20))

func runLosses(t *testing.T, cfg config.Config) []float64 {
	var out []float64
	tr, err := New(cfg, Options{Train: corpus[:4000], Val: corpus[4000:], OnStep: func(m StepMetrics) { out = append(out, m.Loss) }})
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.NoError(t, err)
	return out
}

func TestSameSeedBitwiseSameLosses(t *testing.T) {
	a := runLosses(t, smallConfig())
	b := runLosses(t, smallConfig())
	require.Equal(t, a, b)
	cfg := smallConfig()
	cfg.Train.Seed++
	require.NotEqual(t, a, runLosses(t, cfg))
}

// Accumulating 2 micro-batches of 2 is the same step as one batch of 4.
func TestGradAccumMatchesOneBigBatch(t *testing.T) {
	big := smallConfig()
	acc := smallConfig()
	acc.Train.BatchSize, acc.Train.GradAccum = 2, 2
	for _, order := range []string{"sequential", "random"} {
		big.Data.Order, acc.Data.Order = order, order
		a, b := runLosses(t, big), runLosses(t, acc)
		for i := range a {
			require.InEpsilon(t, a[i], b[i], 1e-5, "%s step %d", order, i)
		}
	}
}

func TestLossFallsAndMetricsFile(t *testing.T) {
	cfg := smallConfig()
	cfg.Train.Steps, cfg.Train.LR, cfg.Train.EvalEvery = 30, 3e-3, 10
	cfg.MetricsFile = filepath.Join(t.TempDir(), "m", "metrics.jsonl")
	tr, err := New(cfg, Options{Train: corpus[:4000], Val: corpus[4000:]})
	require.NoError(t, err)
	res, err := tr.Run(context.Background())
	require.NoError(t, err)
	require.Less(t, res.LastLoss, res.FirstLoss-0.5, "30 steps on a repetitive text must learn something")

	f, err := os.Open(cfg.MetricsFile)
	require.NoError(t, err)
	defer f.Close()
	kinds := map[string]int{}
	sc := bufio.NewScanner(f)
	var lastTrain map[string]any
	for sc.Scan() {
		var obj map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &obj), sc.Text())
		kind := obj["kind"].(string)
		kinds[kind]++
		if kind == "train" {
			for _, k := range []string{"step", "loss", "lr", "grad_norm", "tokens_per_s", "step_ms"} {
				require.Contains(t, obj, k)
			}
			lastTrain = obj
		}
		if kind == "memory" {
			want := float64(nn.GPTConfig{NLayer: 2, NHead: 2, NEmbd: 32, BlockSize: 32, VocabSize: 256}.NumParams() * 4)
			require.Equal(t, want, obj["params_bytes"])
			require.Equal(t, want, obj["grads_bytes"])
			require.Equal(t, 2*want, obj["optim_bytes"])
			require.Greater(t, obj["peak_bytes"].(float64), 4*want)
		}
	}
	require.Equal(t, map[string]int{"train": 30, "eval": 3, "memory": 1}, kinds)
	require.Equal(t, res.LastLoss, lastTrain["loss"])
	require.Equal(t, 30.0, lastTrain["step"], "the last of 30 steps is step 30")
}

func TestSaveAndInitFromRoundTrip(t *testing.T) {
	dir := t.TempDir()
	cfg := smallConfig()
	cfg.Train.Steps = 2
	cfg.SaveTo = filepath.Join(dir, "w.safetensors")
	tr, err := New(cfg, Options{Train: corpus[:4000], Val: corpus[4000:]})
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.NoError(t, err)

	cfg2 := smallConfig()
	cfg2.Train.Seed = 99 // a different init, overwritten by the file
	cfg2.InitFrom = cfg.SaveTo
	tr2, err := New(cfg2, Options{Train: corpus[:4000], Val: corpus[4000:]})
	require.NoError(t, err)
	for _, p := range tr.Model.Params() {
		require.Equal(t, p.F32(), tr2.Model.Param(p.Name).F32(), p.Name)
	}
	_, meta, err := ckpt.Load(cfg.SaveTo)
	require.NoError(t, err)
	mc, ok := ModelConfigFromMetadata(meta)
	require.True(t, ok)
	require.Equal(t, GPTConfig(cfg), mc)
}

func TestInitFromErrors(t *testing.T) {
	dir := t.TempDir()
	m, err := nn.NewGPT(nn.GPTConfig{NLayer: 1, NHead: 2, NEmbd: 8, BlockSize: 4, VocabSize: 256}, 1, tensor.Float32, nil)
	require.NoError(t, err)
	ts := map[string]*tensor.Tensor{}
	for _, p := range m.Params() {
		ts["transformer."+p.Name] = p // Hugging Face GPT2LMHeadModel prefix
	}
	ts["h.0.attn.bias"] = tensor.FromF32(make([]float32, 16), 1, 1, 4, 4) // mask buffer: skipped
	path := filepath.Join(dir, "hf.safetensors")
	require.NoError(t, ckpt.Save(path, ts, nil))
	require.NoError(t, LoadWeights(m, path))

	delete(ts, "transformer.ln_f.bias")
	ts["transformer.wpe.weight"] = tensor.FromF32(make([]float32, 40), 5, 8)
	ts["lm_head.extra"] = tensor.FromF32(make([]float32, 1), 1)
	bad := filepath.Join(dir, "bad.safetensors")
	require.NoError(t, ckpt.Save(bad, ts, nil))
	err = LoadWeights(m, bad)
	require.EqualError(t, err, "init_from "+bad+" does not fit the model (check model.* against the file): "+
		"wpe.weight has shape [5 8] in the file but [4 8] in the model; missing ln_f.bias [8]; unknown tensor lm_head.extra")
}

func TestStepOwnersConflict(t *testing.T) {
	_, err := New(smallConfig(), Options{Train: corpus, Plugins: []Plugin{owner{"pp"}, owner{"other"}}})
	require.EqualError(t, err, "trainer: plugins [pp other] all want to own the step; at most one may (check the parallel config)")
}

type owner struct{ name string }

func (o owner) Name() string { return o.name }
func (o owner) RunStep(t *Trainer, step int) (float64, error) {
	return math.NaN(), nil
}
func (o owner) EvalLoss(t *Trainer, x, y *tensor.Tensor) (float64, error) {
	return math.NaN(), nil
}

func TestGenerateGreedyIsDeterministic(t *testing.T) {
	m, err := nn.NewGPT(nn.GPTConfig{NLayer: 1, NHead: 2, NEmbd: 16, BlockSize: 8, VocabSize: 256}, 1, tensor.Float32, nil)
	require.NoError(t, err)
	a, err := Generate(m, data.Encode("func"), 12, 0, 0, 1)
	require.NoError(t, err)
	b, err := Generate(m, data.Encode("func"), 12, 0, 0, 2)
	require.NoError(t, err)
	require.Equal(t, a, b, "temperature 0 ignores the seed")
	require.Len(t, a, 16)
	require.Equal(t, data.Encode("func"), a[:4])
	// Greedy picks the argmax of the logits at the last position.
	idx := tensor.FromI32(append([]int32(nil), a[8:15]...), 1, 7)
	logits, err := m.Logits(idx, nn.Pass{})
	require.NoError(t, err)
	best, bestV := 0, math.Inf(-1)
	for v := 0; v < 256; v++ {
		if x := logits.At(6*256 + v); x > bestV {
			best, bestV = v, x
		}
	}
	require.Equal(t, int32(best), a[15])
}
