package trainer

import (
	"bufio"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// poison makes chosen steps non-finite: a NaN loss (as a loss reducer
// would report it) or a NaN in one gradient, and records whether the
// weights moved across each step.
type poison struct {
	nanLoss, nanGrad map[int]bool
	param            string
	step             int
	before           []float32
	moved            map[int]bool
}

func (p *poison) Name() string { return "poison" }

func (p *poison) ReduceLoss(t *Trainer, loss float64) (float64, error) {
	if p.nanLoss[p.step] {
		return math.NaN(), nil
	}
	return loss, nil
}

func (p *poison) PreStep(t *Trainer) error {
	w := t.Model.Param(p.param)
	p.before = append(p.before[:0], w.F32()...)
	if p.nanGrad[p.step] {
		w.Grad.F32()[3] = float32(math.Inf(1))
	}
	return nil
}

func (p *poison) PostStep(t *Trainer, m *StepMetrics) error {
	w := t.Model.Param(p.param).F32()
	moved := false
	for i := range w {
		moved = moved || w[i] != p.before[i]
	}
	p.moved[p.step] = moved
	p.step++
	return nil
}

func newPoison(nanLoss, nanGrad []int) *poison {
	p := &poison{nanLoss: map[int]bool{}, nanGrad: map[int]bool{}, param: "h.1.mlp.c_fc.weight", moved: map[int]bool{}}
	for _, s := range nanLoss {
		p.nanLoss[s] = true
	}
	for _, s := range nanGrad {
		p.nanGrad[s] = true
	}
	return p
}

func TestNonFiniteStopKeepsSavedFile(t *testing.T) {
	dir := t.TempDir()
	cfg := smallConfig()
	cfg.SaveTo = filepath.Join(dir, "w.safetensors")
	cfg.MetricsFile = filepath.Join(dir, "m.jsonl")
	previous := []byte("the previous weights")
	require.NoError(t, os.WriteFile(cfg.SaveTo, previous, 0o644))
	tr, err := New(cfg, Options{Train: corpus[:4000], Val: corpus[4000:], Plugins: []Plugin{newPoison(nil, []int{2})}})
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.EqualError(t, err, "step 3: trainer: non-finite gradient norm (+Inf); "+
		"first non-finite gradient: h.1.mlp.c_fc.weight (element 3 = +Inf); stopped before the update (train.nonfinite=stop): "+
		"lower train.lr, set train.grad_clip, or set train.nonfinite=skip")
	got, err := os.ReadFile(cfg.SaveTo)
	require.NoError(t, err)
	require.Equal(t, previous, got)
	rows := readMetrics(t, cfg.MetricsFile)
	require.Len(t, rows, 2, "the records of steps 1 and 2, the last before the stop")
	require.Equal(t, 2.0, rows[1]["step"], "steps count completed steps, from 1")
}

func TestNonFiniteSkipSkipsAndRecovers(t *testing.T) {
	dir := t.TempDir()
	cfg := smallConfig()
	cfg.Train.NonFinite = "skip"
	cfg.Train.EvalEvery = 0
	cfg.MetricsFile = filepath.Join(dir, "m.jsonl")
	p := newPoison([]int{2}, []int{3})
	tr, err := New(cfg, Options{Train: corpus[:4000], Val: corpus[4000:], Plugins: []Plugin{p}})
	require.NoError(t, err)
	res, err := tr.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, 6, res.StepsRun)
	require.Equal(t, 2, res.Skipped)
	require.Equal(t, map[int]bool{0: true, 1: true, 2: false, 3: false, 4: true, 5: true}, p.moved)
	for _, w := range tr.Model.Params() {
		_, bad := firstNonFinite(w)
		require.False(t, bad, w.Name)
	}
	var train []map[string]any
	for _, r := range readMetrics(t, cfg.MetricsFile) {
		if r["kind"] == "train" {
			train = append(train, r)
		}
	}
	require.Len(t, train, 6)
	for s, r := range train {
		require.Equal(t, float64(s+1), r["step"])
		_, marked := r["skipped"]
		require.Equal(t, s == 2 || s == 3, marked, "step %d", s)
	}
	require.Equal(t, true, train[2]["skipped"])
	require.Nil(t, train[2]["loss"], "a NaN loss is written as null")
	require.Contains(t, train[2], "loss")
	require.Nil(t, train[3]["grad_norm"])
	require.IsType(t, 0.0, train[4]["loss"])
}

func TestNonFiniteSkipStopsAfterMaxSkips(t *testing.T) {
	cfg := smallConfig()
	cfg.Train.NonFinite, cfg.Train.NonFiniteMaxSkips = "skip", 2
	tr, err := New(cfg, Options{Train: corpus[:4000], Val: corpus[4000:], Plugins: []Plugin{newPoison([]int{0, 1, 2}, nil)}})
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.EqualError(t, err, "step 3: trainer: non-finite loss (NaN), 3 steps in a row (train.nonfinite_max_skips=2); "+
		"no gradient held by rank 0 is non-finite; lower train.lr or set train.grad_clip")
}

// A learning rate far too large makes the loss NaN within a few steps;
// the run must stop before saving.
func TestNonFiniteFromHugeLR(t *testing.T) {
	dir := t.TempDir()
	cfg := smallConfig()
	cfg.Train.LR, cfg.Train.MinLR, cfg.Train.GradClip, cfg.Train.Steps = 1e6, 0, 0, 20
	cfg.SaveTo = filepath.Join(dir, "w.safetensors")
	tr, err := New(cfg, Options{Train: corpus[:4000], Val: corpus[4000:]})
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.ErrorContains(t, err, "non-finite")
	require.ErrorContains(t, err, "train.nonfinite=stop")
	require.NoFileExists(t, cfg.SaveTo)
}

func TestMetricsWriteFailureStopsAtOnce(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full")
	}
	cfg := smallConfig()
	cfg.MetricsFile = "/dev/full"
	steps := 0
	tr, err := New(cfg, Options{Train: corpus[:4000], Val: corpus[4000:], OnStep: func(StepMetrics) { steps++ }})
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.EqualError(t, err, "trainer: metrics_file /dev/full: write /dev/full: no space left on device")
	require.Equal(t, 1, steps, "the run stops at the first failed write")
}

func TestSaveAndInitFromRefuseNonFinite(t *testing.T) {
	dir := t.TempDir()
	cfg := smallConfig()
	tr, err := New(cfg, Options{Train: corpus[:4000], Val: corpus[4000:]})
	require.NoError(t, err)
	path := filepath.Join(dir, "w.safetensors")
	require.NoError(t, SaveWeights(tr.Model, path))
	good, err := os.ReadFile(path)
	require.NoError(t, err)

	tr.Model.Param("h.0.attn.c_proj.bias").F32()[5] = float32(math.NaN())
	require.EqualError(t, SaveWeights(tr.Model, path),
		"save_to "+path+" not written: tensor h.0.attn.c_proj.bias holds a non-finite value (element 5 = NaN)")
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, good, got)

	ts := map[string]*tensor.Tensor{}
	for _, p := range tr.Model.Params() {
		ts[p.Name] = p
	}
	bad := filepath.Join(dir, "nan.safetensors")
	require.NoError(t, ckpt.Save(bad, ts, nil))
	fresh, err := New(cfg, Options{Train: corpus[:4000], Val: corpus[4000:]})
	require.NoError(t, err)
	require.EqualError(t, LoadWeights(fresh.Model, bad),
		"init_from "+bad+": tensor h.0.attn.c_proj.bias holds a non-finite value (element 5 = NaN)")
}

func readMetrics(t *testing.T, path string) []map[string]any {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var obj map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &obj), sc.Text())
		out = append(out, obj)
	}
	return out
}
