package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// testCorpus writes a small deterministic text corpus and returns its path.
func testCorpus(t *testing.T) string {
	var b strings.Builder
	for i := 0; i < 3000; i++ {
		fmt.Fprintf(&b, "line %d: func f%d(x int) int { return x*%d + %d }\n", i, i%37, i%11, i%7)
	}
	p := filepath.Join(t.TempDir(), "corpus.txt")
	require.NoError(t, os.WriteFile(p, []byte(b.String()), 0o644))
	return p
}

// testConfig is a tiny GPT with gradient accumulation, one compute thread
// (so results are bitwise reproducible) and the given corpus.
func testConfig(corpus string, steps int) string {
	return fmt.Sprintf(`
model: {n_layer: 1, n_head: 2, n_embd: 32, block_size: 16}
train: {steps: %d, batch_size: 3, grad_accum: 2, threads: 1, warmup_steps: 2, lr: 3.0e-3, eval_batches: 2}
data: {path: %q, val_fraction: 0.1}
`, steps, corpus)
}

// handles creates config, model, optimizer, loader and session from text.
type handles struct{ cfg, model, opt, loader, sess int64 }

func newHandles(t *testing.T, text string) handles {
	var h handles
	var err error
	h.cfg, err = apiConfigNew(text)
	require.NoError(t, err)
	h.model, err = apiModelNew(h.cfg)
	require.NoError(t, err)
	h.opt, err = apiOptimizerNew(h.cfg, h.model)
	require.NoError(t, err)
	h.loader, err = apiLoaderNew(h.cfg)
	require.NoError(t, err)
	h.sess, err = apiPrepare(h.cfg, h.model, h.opt, h.loader)
	require.NoError(t, err)
	return h
}

// referenceLosses trains with trainer.New and Step, the path of `tinyacc
// train`, and returns the per-step losses and the final weights.
func referenceLosses(t *testing.T, text string, steps int) ([]float64, *trainer.Trainer) {
	r, err := config.FromText(text)
	require.NoError(t, err)
	tr, err := trainer.New(r.Config, trainer.Options{})
	require.NoError(t, err)
	var losses []float64
	for s := 0; s < steps; s++ {
		m, err := tr.Step(s)
		require.NoError(t, err)
		losses = append(losses, m.Loss)
	}
	return losses, tr
}

func TestPieceByPieceStepMatchesTrainer(t *testing.T) {
	const steps = 4
	text := testConfig(testCorpus(t), steps)
	want, ref := referenceLosses(t, text, steps)

	h := newHandles(t, text)
	B, T, A, _, err := apiLoaderInfo(h.loader)
	require.NoError(t, err)
	require.Equal(t, []int{3, 16, 2}, []int{B, T, A})
	x, y := make([]int32, B*T), make([]int32, B*T)
	var got []float64
	for s := 0; s < steps; s++ {
		for a := 0; a < A; a++ {
			require.NoError(t, apiLoaderBatch(h.loader, s, a, x, y))
			loss, _, err := apiForward(h.sess, x, y, B, T, true)
			require.NoError(t, err)
			require.NoError(t, apiBackward(loss))
			require.NoError(t, freeHandle(loss))
			stepped, err := apiStep(h.sess)
			require.NoError(t, err)
			assert.Equal(t, a == A-1, stepped, "optimizer steps only after grad_accum backward passes")
			require.NoError(t, apiZeroGrad(h.sess))
		}
		m, err := apiMetrics(h.sess)
		require.NoError(t, err)
		assert.Equal(t, float64(s+1), m[0], "the steps completed")
		got = append(got, m[1])
	}
	assert.Equal(t, want, got, "losses of forward/backward/step vs trainer.Step")

	// The weights agree too, read through the by-name copy.
	for _, p := range ref.Model.Params() {
		buf := make([]float32, p.Numel())
		require.NoError(t, apiParamGet(h.model, p.Name, buf, false))
		require.Equal(t, p.F32(), buf, p.Name)
	}
}

func TestFusedAndLoaderStepsMatchTrainer(t *testing.T) {
	const steps = 3
	text := testConfig(testCorpus(t), steps)
	want, _ := referenceLosses(t, text, steps)

	fused, run := newHandles(t, text), newHandles(t, text)
	B, T, A, _, err := apiLoaderInfo(fused.loader)
	require.NoError(t, err)
	var gotFused, gotRun []float64
	for s := 0; s < steps; s++ {
		x, y := make([]int32, A*B*T), make([]int32, A*B*T)
		for a := 0; a < A; a++ {
			require.NoError(t, apiLoaderBatch(fused.loader, s, a, x[a*B*T:(a+1)*B*T], y[a*B*T:(a+1)*B*T]))
		}
		l, err := apiTrainStep(fused.sess, x, y)
		require.NoError(t, err)
		gotFused = append(gotFused, l)
		l, err = apiRunStep(run.sess)
		require.NoError(t, err)
		gotRun = append(gotRun, l)
	}
	assert.Equal(t, want, gotFused)
	assert.Equal(t, want, gotRun)
	step, micro, err := apiSessionState(run.sess)
	require.NoError(t, err)
	assert.Equal(t, []int{steps, 0}, []int{step, micro})

	_, err = apiTrainStep(fused.sess, make([]int32, 5), make([]int32, 5))
	assert.EqualError(t, err, "train_step: inputs hold 5 and targets 5 tokens, but a step is train.grad_accum*train.batch_size*model.block_size = 2*3*16 = 96")
}

func TestHandleErrors(t *testing.T) {
	h := newHandles(t, testConfig(testCorpus(t), 2))
	require.NoError(t, freeHandle(h.model))
	_, err := apiParamNames(h.model)
	assert.EqualError(t, err, fmt.Sprintf("handle %d was already freed", h.model))
	assert.Equal(t, errBadHandle, codeOf(err))
	assert.EqualError(t, freeHandle(h.model), fmt.Sprintf("handle %d was already freed", h.model))

	_, err = apiParamNames(1 << 50)
	assert.EqualError(t, err, fmt.Sprintf("handle %d is not a tinyacc handle (never issued)", int64(1<<50)))
	_, err = apiParamNames(h.sess)
	assert.EqualError(t, err, fmt.Sprintf("handle %d is a session, not a model", h.sess))

	// The session keeps training with its model after the handle is gone.
	_, err = apiRunStep(h.sess)
	assert.NoError(t, err)
}

func TestStateErrors(t *testing.T) {
	h := newHandles(t, testConfig(testCorpus(t), 2))
	_, err := apiStep(h.sess)
	assert.EqualError(t, err, "step: no backward pass since the last step; call backward first")
	assert.Equal(t, errState, codeOf(err))

	x, y := make([]int32, 3*16), make([]int32, 3*16)
	loss, v, err := apiForward(h.sess, x, y, 3, 16, true)
	require.NoError(t, err)
	lv, err := apiLossValue(loss)
	require.NoError(t, err)
	assert.Equal(t, v, lv)
	require.NoError(t, apiBackward(loss))
	err = apiBackward(loss)
	assert.EqualError(t, err, fmt.Sprintf("backward: loss handle %d was already backpropagated; run forward again", loss))

	x[5] = 300
	_, _, err = apiForward(h.sess, x, y, 3, 16, false)
	assert.EqualError(t, err, "input token 300 at position 5 is outside the vocabulary [0, 256)")
	_, _, err = apiForward(h.sess, x[:10], y, 3, 16, false)
	assert.EqualError(t, err, "inputs hold 10 and targets 48 tokens, but batch*seq = 3*16 = 48")
	_, err = apiMetrics(h.sess)
	assert.EqualError(t, err, "metrics: no optimizer step has run yet")
}

func TestConfigErrorsNameTheKey(t *testing.T) {
	_, err := apiConfigNew("model: {n_layrs: 3}")
	require.Error(t, err)
	assert.Equal(t, errConfig, codeOf(err))
	assert.Contains(t, err.Error(), "model.n_layrs")

	_, err = apiConfigNew(`{"train": {"lr": "fast"}}`)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "train.lr")

	c, err := apiConfigNew("")
	require.NoError(t, err)
	js, err := apiConfigJSON(c)
	require.NoError(t, err)
	assert.Contains(t, js, `"n_layer":4`)
	assert.Contains(t, js, `"schedule":"cosine"`)
}

func TestPrepareChecksShapes(t *testing.T) {
	corpus := testCorpus(t)
	h := newHandles(t, testConfig(corpus, 2))
	other, err := apiConfigNew(strings.Replace(testConfig(corpus, 2), "n_embd: 32", "n_embd: 64", 1))
	require.NoError(t, err)
	_, err = apiPrepare(other, h.model, 0, 0)
	assert.EqualError(t, err, "prepare: model.n_embd is 64 in the config but the model was built with 32; build the model from the same config")
}

func TestParamsCopyInAndOut(t *testing.T) {
	h := newHandles(t, testConfig(testCorpus(t), 2))
	names, err := apiParamNames(h.model)
	require.NoError(t, err)
	require.Contains(t, names, "wte.weight")
	shape, err := apiParamShape(h.model, "wte.weight")
	require.NoError(t, err)
	assert.Equal(t, []int{256, 32}, shape)

	in := make([]float32, 256*32)
	for i := range in {
		in[i] = float32(i) * 0.5
	}
	require.NoError(t, apiParamSet(h.model, "wte.weight", in))
	out := make([]float32, len(in))
	require.NoError(t, apiParamGet(h.model, "wte.weight", out, false))
	assert.Equal(t, in, out)

	err = apiParamGet(h.model, "wte.weight", out[:7], false)
	assert.EqualError(t, err, "parameter wte.weight has 8192 elements (shape [256 32]) but the buffer holds 7")
	assert.Equal(t, errSize, codeOf(err))
	err = apiParamSet(h.model, "nope", in)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `no parameter named "nope"`)
}

func TestSaveAndLoadState(t *testing.T) {
	text := testConfig(testCorpus(t), 4)
	a := newHandles(t, text)
	_, err := apiRunStep(a.sess)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, apiModelSave(a.model, filepath.Join(dir, "model.safetensors")))
	require.NoError(t, apiOptimizerSave(a.opt, filepath.Join(dir, "optim.safetensors")))

	// A second session restored from the files continues like the first.
	b := newHandles(t, text)
	require.NoError(t, apiModelLoad(b.model, filepath.Join(dir, "model.safetensors")))
	require.NoError(t, apiOptimizerLoad(b.opt, filepath.Join(dir, "optim.safetensors")))
	require.NoError(t, apiSetStep(b.sess, 1))
	names, err := apiParamNames(a.model)
	require.NoError(t, err)
	for _, n := range names {
		shape, err := apiParamShape(a.model, n)
		require.NoError(t, err)
		size := 1
		for _, d := range shape {
			size *= d
		}
		wa, wb := make([]float32, size), make([]float32, size)
		require.NoError(t, apiParamGet(a.model, n, wa, false))
		require.NoError(t, apiParamGet(b.model, n, wb, false))
		require.Equal(t, wa, wb, n)
	}
	err = apiOptimizerLoad(b.opt, filepath.Join(dir, "model.safetensors"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "missing exp_avg.wte.weight")
}

func TestGenerateAndEvaluate(t *testing.T) {
	h := newHandles(t, testConfig(testCorpus(t), 2))
	toks, err := apiGenerate(h.model, []int32{'f', 'u', 'n', 'c'}, 5, 0, 0, 1)
	require.NoError(t, err)
	assert.Len(t, toks, 9)
	assert.Equal(t, []int32{'f', 'u', 'n', 'c'}, toks[:4])
	v, err := apiEvaluate(h.sess)
	require.NoError(t, err)
	// An untrained byte model is close to uniform over 256 tokens.
	assert.InDelta(t, 5.545, v, 0.1)
}

// TestOptimizerResumeContinuesExactly trains 4 steps straight and compares
// with 2 steps, a save, and 2 more steps in a fresh session loaded from the
// files: AdamW's step counts travel with its moments, so the losses match
// bit for bit.
func TestOptimizerResumeContinuesExactly(t *testing.T) {
	text := testConfig(testCorpus(t), 4)
	want, _ := referenceLosses(t, text, 4)

	a := newHandles(t, text)
	for s := 0; s < 2; s++ {
		_, err := apiRunStep(a.sess)
		require.NoError(t, err)
	}
	dir := t.TempDir()
	model, opt := filepath.Join(dir, "model.safetensors"), filepath.Join(dir, "optim.safetensors")
	require.NoError(t, apiModelSave(a.model, model))
	require.NoError(t, apiOptimizerSave(a.opt, opt))

	b := newHandles(t, text)
	require.NoError(t, apiModelLoad(b.model, model))
	require.NoError(t, apiOptimizerLoad(b.opt, opt))
	require.NoError(t, apiSetStep(b.sess, 2))
	var got []float64
	for s := 2; s < 4; s++ {
		v, err := apiRunStep(b.sess)
		require.NoError(t, err)
		got = append(got, v)
	}
	require.Equal(t, want[2:], got)

	// The counts are in the file, and a count for a parameter the
	// optimizer lacks is refused before anything is changed.
	ts, _, err := ckpt.Load(opt)
	require.NoError(t, err)
	require.Equal(t, []float64{2}, ts["step.wte.weight"].F64())
	ts["step.nope.weight"] = tensor.FromF64([]float64{1}, 1)
	bad := filepath.Join(dir, "bad.safetensors")
	require.NoError(t, ckpt.Save(bad, ts, nil))
	err = apiOptimizerLoad(b.opt, bad)
	require.EqualError(t, err, "optimizer state "+bad+" does not fit this optimizer (same model and train.optimizer?): unknown buffer step.nope.weight")
}
