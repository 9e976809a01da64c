package main

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/optim"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// apiParamNames lists a model's parameters (Hugging Face GPT-2 names) in
// forward order.
func apiParamNames(h int64) ([]string, error) {
	m, err := get[modelObj](h)
	if err != nil {
		return nil, err
	}
	ps := m.model.Params()
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name
	}
	return names, nil
}

// param finds a parameter by name, listing a few valid names when absent.
func (m *modelObj) param(name string) (*tensor.Tensor, error) {
	if p := m.model.Param(name); p != nil {
		return p, nil
	}
	var names []string
	for _, p := range m.model.Params() {
		names = append(names, p.Name)
	}
	if len(names) > 4 {
		names = append(names[:4], "...")
	}
	return nil, fail(errInvalidArg, "no parameter named %q; names look like %s", name, strings.Join(names, ", "))
}

// apiParamShape returns the shape of a parameter.
func apiParamShape(h int64, name string) ([]int, error) {
	m, err := get[modelObj](h)
	if err != nil {
		return nil, err
	}
	p, err := m.param(name)
	if err != nil {
		return nil, err
	}
	return append([]int(nil), p.Shape()...), nil
}

// float32s returns the float32 storage of a parameter (or its gradient).
func float32s(what string, t *tensor.Tensor) ([]float32, error) {
	if !t.HasStorage() {
		return nil, fail(errUnsupported, "%s is sharded across the ranks (zero.stage 3) and not held by this one; save the model (on every rank) to get its full weights", what)
	}
	if t.DType() != tensor.Float32 {
		return nil, fail(errUnsupported, "%s is %s; only float32 can be copied through the C ABI", what, t.DType())
	}
	return t.F32(), nil
}

func sizeCheck(what string, t *tensor.Tensor, n int) error {
	if n != t.Numel() {
		return fail(errSize, "%s has %d elements (shape %v) but the buffer holds %d", what, t.Numel(), t.Shape(), n)
	}
	return nil
}

// apiParamGet copies a parameter (grad=false) or its gradient (grad=true;
// zeros before the first backward) into out, which must hold exactly its
// elements.
func apiParamGet(h int64, name string, out []float32, grad bool) error {
	m, err := get[modelObj](h)
	if err != nil {
		return err
	}
	p, err := m.param(name)
	if err != nil {
		return err
	}
	what := "parameter " + name
	if err := sizeCheck(what, p, len(out)); err != nil {
		return err
	}
	if !grad {
		if err := m.whole(); err != nil {
			return err
		}
	}
	if grad {
		if p.Grad == nil {
			clear(out)
			return nil
		}
		p, what = p.Grad, "gradient of "+name
	}
	src, err := float32s(what, p)
	if err != nil {
		return err
	}
	copy(out, src)
	return nil
}

// apiParamSet overwrites a parameter with in, which must hold exactly its
// elements.
func apiParamSet(h int64, name string, in []float32) error {
	m, err := get[modelObj](h)
	if err != nil {
		return err
	}
	p, err := m.param(name)
	if err != nil {
		return err
	}
	if err := sizeCheck("parameter "+name, p, len(in)); err != nil {
		return err
	}
	if err := m.whole(); err != nil {
		return err
	}
	dst, err := float32s("parameter "+name, p)
	if err != nil {
		return err
	}
	copy(dst, in)
	return nil
}

// apiModelSave writes the weights as safetensors, the file `tinyacc
// sample` and init_from read. A model prepared in a data-parallel session
// is one model across the ranks: every rank must call this, rank 0 writes,
// gathering ZeRO-3's shards first.
func apiModelSave(h int64, path string) error {
	m, err := get[modelObj](h)
	if err != nil {
		return err
	}
	if s := m.sess; s != nil && len(s.t.Plugins) > 0 {
		s.mu.Lock()
		defer s.mu.Unlock()
		return wrap(errIO, s.t.SaveModel(path))
	}
	if err := m.whole(); err != nil {
		return err
	}
	return wrap(errIO, trainer.SaveWeights(m.model, path))
}

// apiModelLoad reads weights saved by tinyacc or Hugging Face GPT-2 files.
// A model prepared in a session reads, on each rank, only the byte ranges
// of the parts that rank holds (ZeRO-3's shards included); one not built
// yet only checks the file and fills from it when it is (prepare reads
// each rank's byte ranges then).
func apiModelLoad(h int64, path string) error {
	m, err := get[modelObj](h)
	if err != nil {
		return err
	}
	if s := m.sess; s != nil && len(s.t.Plugins) > 0 {
		s.mu.Lock()
		defer s.mu.Unlock()
		return wrap(errIO, s.t.LoadWeights(path))
	}
	if !m.built {
		if err := trainer.CheckWeights(path, m.model.Config, trainer.DTypeOf(m.cfg)); err != nil {
			return wrap(errIO, err)
		}
		m.init = trainer.Init{From: path}
		return nil
	}
	return wrap(errIO, trainer.LoadWeights(m.model, path))
}

// stepPrefix names the per-parameter step counts in an optimizer file:
// "step.<parameter>", a one-element float64 tensor (exact for any count a
// run reaches).
const stepPrefix = "step."

// optimizerTensors is what an optimizer file holds: the optimizer's
// buffers plus, for optimizers whose update depends on it (AdamW's bias
// correction), each parameter's step count.
func optimizerTensors(opt optim.Optimizer) map[string]*tensor.Tensor {
	ts := map[string]*tensor.Tensor{}
	for name, t := range opt.State() {
		ts[name] = t
	}
	if sc, ok := opt.(optim.StepCounter); ok {
		for name, n := range sc.Steps() {
			ts[stepPrefix+name] = tensor.FromF64([]float64{float64(n)}, 1)
		}
	}
	return ts
}

// apiOptimizerSave writes the optimizer's buffers (e.g. AdamW's moments)
// and step counts as safetensors. In a ZeRO session each rank holds and
// writes only its shard.
func apiOptimizerSave(h int64, path string) error {
	o, err := get[optimizerObj](h)
	if err != nil {
		return err
	}
	if _, err := o.optimizer(); err != nil {
		return err
	}
	if _, ok := o.opt.(optim.StepCounter); !ok && o.cfg.Train.Optimizer == "adamw" {
		// Moments without step counts would resume with the bias
		// correction of step 1: refuse rather than write such a file.
		return fail(errUnsupported, "optimizer save: this session's AdamW (%T) does not report its step counts, so a resumed run would not continue exactly; save with zero.stage 0 or train.optimizer sgd", o.opt)
	}
	meta := map[string]string{"producer": "tinyacc", "kind": "optimizer", "optimizer": o.cfg.Train.Optimizer}
	ts := optimizerTensors(o.opt)
	if err := trainer.CheckFinite("optimizer state "+path+" not written", ts); err != nil {
		return fail(errInvalidArg, "%v", err)
	}
	if err := ckpt.Save(path, ts, meta); err != nil {
		return wrap(errIO, fmt.Errorf("optimizer state: %w", err))
	}
	return nil
}

// apiOptimizerLoad restores what apiOptimizerSave wrote: every buffer must
// be present with its shape, and nothing else; step counts may be absent
// for parameters that were never updated. Nothing changes unless the whole
// file fits.
func apiOptimizerLoad(h int64, path string) error {
	o, err := get[optimizerObj](h)
	if err != nil {
		return err
	}
	if _, err := o.optimizer(); err != nil {
		return err
	}
	ts, _, err := ckpt.Load(path)
	if err != nil {
		return wrap(errIO, fmt.Errorf("optimizer state: %w", err))
	}
	state := o.opt.State()
	params := map[string]bool{}
	for _, p := range o.opt.Params() {
		params[p.Name] = true
	}
	sc, hasSteps := o.opt.(optim.StepCounter)
	steps := map[string]int{}
	var problems []string
	for name, dst := range state {
		src, ok := ts[name]
		switch {
		case !ok:
			problems = append(problems, "missing "+name)
		case src.Numel() != dst.Numel() || src.DType() != dst.DType():
			problems = append(problems, fmt.Sprintf("%s is %s %v in the file but %s %v here", name, src.DType(), src.Shape(), dst.DType(), dst.Shape()))
		}
	}
	for name, src := range ts {
		if _, ok := state[name]; ok {
			continue
		}
		param, isStep := strings.CutPrefix(name, stepPrefix)
		switch {
		case !isStep || !hasSteps || !params[param]:
			problems = append(problems, "unknown buffer "+name)
		case src.Numel() != 1 || src.DType() != tensor.Float64 || src.At(0) < 0 || src.At(0) != math.Trunc(src.At(0)):
			problems = append(problems, fmt.Sprintf("%s is not a step count (one float64 whole number >= 0)", name))
		default:
			steps[param] = int(src.At(0))
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return fail(errIO, "optimizer state %s does not fit this optimizer (same model and train.optimizer?): %s", path, strings.Join(problems, "; "))
	}
	for name, dst := range state {
		dst.CopyFrom(ts[name])
	}
	if hasSteps {
		if err := sc.SetSteps(steps); err != nil {
			return wrap(errIO, fmt.Errorf("optimizer state %s: %w", path, err))
		}
	}
	return nil
}

// apiGenerate samples n tokens after prompt (see trainer.Generate).
func apiGenerate(h int64, prompt []int32, n int, temperature float64, topK int, seed int64) ([]int32, error) {
	m, err := get[modelObj](h)
	if err != nil {
		return nil, err
	}
	if err := trainer.CheckSampling(n, temperature, topK); err != nil {
		return nil, fail(errInvalidArg, "generate: %v", err)
	}
	V := m.model.Config.VocabSize
	for i, t := range prompt {
		if t < 0 || int(t) >= V {
			return nil, fail(errInvalidArg, "generate: prompt token %d at position %d is outside the vocabulary [0, %d)", t, i, V)
		}
	}
	if err := m.whole(); err != nil {
		return nil, err
	}
	out, err := trainer.Generate(m.model, prompt, n, temperature, topK, seed)
	return out, wrap(errRuntime, err)
}
