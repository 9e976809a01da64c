package main

import (
	"fmt"
	"sync"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/data"
	"github.com/tinyacc/tinyacc/core/optim"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins"
)

// session is a prepared trainer plus the bookkeeping that lets callers
// drive a step piece by piece (forward, backward, step) and still get the
// exact step `tinyacc train` runs: micro-batches counted against
// train.grad_accum, each backward scaled by 1/grad_accum, the step's loss
// the mean over its micro-batches.
type session struct {
	mu      sync.Mutex // one call at a time: the trainer is not reentrant
	t       *trainer.Trainer
	model   *modelObj
	opt     *optimizerObj
	loader  *loaderObj
	step    int     // index of the next optimizer step
	micro   int     // backward passes since the last optimizer step
	lossSum float64 // their losses
	last    *trainer.StepMetrics
}

// lossObj is the result of a forward pass kept for backward.
type lossObj struct {
	s     *session
	t     *tensor.Tensor // nil once backpropagated or released
	value float64
	done  bool
}

// release frees the graph of a loss that was never backpropagated.
func (l *lossObj) release() {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if l.t != nil {
		tensor.FreeGraph(l.t)
		l.t.Release()
		l.t = nil
	}
}

// apiPrepare joins a config, a model and optionally an optimizer and a data
// loader (0 = none) into a trainer session. The config drives the step
// (learning-rate schedule, clipping, grad_accum, batch size); the model and
// loader must have been built for the same shapes. In a process launched as
// one of several ranks, a session with an optimizer trains data-parallel:
// every rank reads its slice of the global batch (train.batch_size
// sequences per rank and micro-batch) and the gradients are averaged, so
// all ranks step one model. Without an optimizer nothing is trained and
// each rank runs its own forward passes.
func apiPrepare(ch, mh, oh, lh int64) (int64, error) {
	c, err := get[configObj](ch)
	if err != nil {
		return 0, err
	}
	m, err := get[modelObj](mh)
	if err != nil {
		return 0, err
	}
	o, err := getOptional[optimizerObj](oh)
	if err != nil {
		return 0, err
	}
	l, err := getOptional[loaderObj](lh)
	if err != nil {
		return 0, err
	}
	cfg := c.cfg
	if err := sameModel(cfg, m.cfg); err != nil {
		return 0, err
	}
	if o != nil && o.model != m {
		return 0, fail(errInvalidArg, "prepare: the optimizer was created for another model; create it from this model's parameters")
	}
	if l != nil && l.cfg.Model.BlockSize != cfg.Model.BlockSize {
		return 0, fail(errConfig, "prepare: the data loader cuts windows of %d tokens but model.block_size is %d; build both from the same config",
			l.cfg.Model.BlockSize, cfg.Model.BlockSize)
	}
	applyThreads(cfg)
	var train, val *data.Loader
	if l != nil {
		train, val = l.train, l.val
	}
	opts := trainer.Options{Alloc: m.alloc}
	t, err := func() (*trainer.Trainer, error) {
		// The world's lock is held while the plugins prepare, so no
		// caller collective on another thread interleaves with their
		// broadcasts.
		world.Lock()
		defer world.Unlock()
		if o != nil {
			if err := dataParallel(cfg, &opts); err != nil {
				return nil, err
			}
		}
		return build(cfg, m, o, train, val, opts)
	}()
	if err != nil {
		return 0, err
	}
	if o != nil {
		// ZeRO swaps in an optimizer over this rank's shard; saving and
		// loading must see that one.
		o.opt = t.Opt
	}
	if l != nil {
		// The loader now hands out this rank's slice of each batch.
		l.rank, l.size = t.DataRank, t.DataSize
	}
	s := &session{t: t, model: m, opt: o, loader: l}
	m.sess = s
	return register(s), nil
}

// build makes the session's trainer. A model only described so far is
// constructed by placement (trainer.NewPlaced, the rule of `tinyacc
// train`): the plugins of opts place it and this rank allocates and fills
// only its own parts, then the optimizer over them. A model already built
// (its values were read or set before prepare) is handed to the plugins
// whole, with its optimizer, and they cut it (trainer.NewWith).
func build(cfg config.Config, m *modelObj, o *optimizerObj, train, val *data.Loader, opts trainer.Options) (*trainer.Trainer, error) {
	if !m.built {
		t, err := trainer.NewPlaced(cfg, m.model, m.init, o != nil, train, val, opts)
		// Placed, the parameters may live in a plugin's buffers (ZeRO-3's
		// shards) rather than in the model's tensors: built all the same.
		m.built = err == nil || hasStorage(m.model)
		return t, wrap(errRuntime, err)
	}
	var opt optim.Optimizer
	if o != nil {
		var err error
		if opt, err = o.optimizer(); err != nil {
			return nil, err
		}
	}
	t, err := trainer.NewWith(cfg, m.model, opt, train, val, opts)
	return t, wrap(errRuntime, err)
}

// dataParallel adds to opts the plugins that make the ranks of a launched
// job train one model together (DDP or ZeRO, as plugins.Build picks them
// from the config), with this process's rank. A process that was not
// launched is a world of one and gets none. The caller holds world's lock.
func dataParallel(cfg config.Config, opts *trainer.Options) error {
	g, err := worldGroup()
	if err != nil {
		return err
	}
	return dataParallelOn(cfg, g, opts)
}

// dataParallelOn is dataParallel over the group g.
func dataParallelOn(cfg config.Config, g comm.Group, opts *trainer.Options) error {
	if g.Size() == 1 {
		return nil
	}
	ps, m, err := plugins.Build(cfg, g)
	if err != nil {
		return fail(errConfig, "prepare: data-parallel training over %d ranks: %v", g.Size(), err)
	}
	opts.Plugins, opts.Mesh, opts.Rank, opts.World = ps, m, g.Rank(), g.Size()
	return nil
}

// sameModel checks that the model was built with the shape the config
// describes, naming the first key that differs.
func sameModel(run, built config.Config) error {
	a, b := run.Model, built.Model
	keys := []struct {
		key        string
		run, built int
	}{{"model.n_layer", a.NLayer, b.NLayer}, {"model.n_head", a.NHead, b.NHead}, {"model.n_embd", a.NEmbd, b.NEmbd},
		{"model.block_size", a.BlockSize, b.BlockSize}, {"model.vocab_size", a.VocabSize, b.VocabSize}}
	for _, k := range keys {
		if k.run != k.built {
			return fail(errConfig, "prepare: %s is %d in the config but the model was built with %d; build the model from the same config",
				k.key, k.run, k.built)
		}
	}
	rv, bv := config.Values(run), config.Values(built)
	for _, k := range []string{"model.arch", "model.n_kv_head", "model.intermediate_size", "model.rope_theta", "model.norm_eps", "model.tie_embeddings"} {
		if rv[k] != bv[k] {
			return fail(errConfig, "prepare: %s is %s in the config but the model was built with %s; build the model from the same config", k, rv[k], bv[k])
		}
	}
	return nil
}

// getSession returns a locked session; the caller unlocks it.
func getSession(h int64) (*session, error) {
	s, err := get[session](h)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	return s, nil
}

// accum is the number of micro-batches per optimizer step.
func (s *session) accum() int { return max(1, s.t.Cfg.Train.GradAccum) }

// tokens checks a caller batch and wraps it as [B, T] tensors (copies, so
// the caller's memory is not kept).
func (s *session) tokens(x, y []int32, B, T int) (*tensor.Tensor, *tensor.Tensor, error) {
	cfg := s.t.Cfg.Model
	if B <= 0 || T <= 0 || T > cfg.BlockSize {
		return nil, nil, fail(errInvalidArg, "batch %d x %d tokens: need batch >= 1 and 1 <= seq <= model.block_size (%d)", B, T, cfg.BlockSize)
	}
	if len(x) != B*T || len(y) != B*T {
		return nil, nil, fail(errSize, "inputs hold %d and targets %d tokens, but batch*seq = %d*%d = %d", len(x), len(y), B, T, B*T)
	}
	for i := range x {
		if x[i] < 0 || int(x[i]) >= cfg.VocabSize {
			return nil, nil, fail(errInvalidArg, "input token %d at position %d is outside the vocabulary [0, %d)", x[i], i, cfg.VocabSize)
		}
		if y[i] < 0 || int(y[i]) >= cfg.VocabSize {
			return nil, nil, fail(errInvalidArg, "target token %d at position %d is outside the vocabulary [0, %d)", y[i], i, cfg.VocabSize)
		}
	}
	return tensor.FromI32(append([]int32(nil), x...), B, T), tensor.FromI32(append([]int32(nil), y...), B, T), nil
}

// apiForward runs the model on one micro-batch and returns its mean loss.
// With keep, the graph is kept for backward under a new loss handle;
// without, it is freed at once (evaluation).
func apiForward(h int64, x, y []int32, B, T int, keep bool) (int64, float64, error) {
	s, err := getSession(h)
	if err != nil {
		return 0, 0, err
	}
	defer s.mu.Unlock()
	xt, yt, err := s.tokens(x, y, B, T)
	if err != nil {
		return 0, 0, err
	}
	A := s.accum()
	info := s.t.TrainPass(s.step, s.micro%A)
	info.Train = keep // a forward kept for backward trains; one that is not evaluates
	loss, err := s.t.Forward(xt, yt, info)
	if err != nil {
		return 0, 0, wrap(errRuntime, err)
	}
	v := loss.Scalar()
	if !keep {
		tensor.FreeGraph(loss)
		loss.Release()
		return 0, v, nil
	}
	return register(&lossObj{s: s, t: loss, value: v}), v, nil
}

// apiLossValue reads the value of a loss handle.
func apiLossValue(h int64) (float64, error) {
	l, err := get[lossObj](h)
	if err != nil {
		return 0, err
	}
	return l.value, nil
}

// apiBackward accumulates the gradients of a loss scaled by
// 1/train.grad_accum and frees its graph.
func apiBackward(h int64) error {
	l, err := get[lossObj](h)
	if err != nil {
		return err
	}
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.done {
		return fail(errState, "backward: loss handle %d was already backpropagated; run forward again", h)
	}
	if l.t == nil {
		return fail(errState, "backward: the graph of loss handle %d was released", h)
	}
	A := s.accum()
	if s.micro >= A {
		return fail(errState, "backward: %d micro-batches are already accumulated and train.grad_accum is %d; call step (or zero_grad) first", s.micro, A)
	}
	info := tensor.PassInfo{Micro: s.micro, Last: s.micro == A-1}
	err = s.t.Backward(l.t, 1/float64(A), info)
	l.t, l.done = nil, true
	if err != nil {
		return wrap(errRuntime, err)
	}
	s.micro++
	s.lossSum += l.value
	return nil
}

// apiStep runs the optimizer step once train.grad_accum backward passes
// are accumulated (clipping, update, zeroing the gradients) and reports
// whether it did; before that it only counts, as an accumulating
// optimizer step does in PyTorch-style loops.
func apiStep(h int64) (bool, error) {
	s, err := getSession(h)
	if err != nil {
		return false, err
	}
	defer s.mu.Unlock()
	return s.update()
}

func (s *session) update() (bool, error) {
	if s.t.Opt == nil {
		return false, fail(errState, "step: the session has no optimizer; pass one to prepare")
	}
	if s.micro == 0 {
		return false, fail(errState, "step: no backward pass since the last step; call backward first")
	}
	A := s.accum()
	if s.micro < A {
		return false, nil
	}
	m, err := s.t.Update(s.step, s.lossSum/float64(A))
	if err != nil {
		return false, wrap(errRuntime, fmt.Errorf("step %d: %w", s.step, err))
	}
	s.last = &m
	s.step++
	s.micro, s.lossSum = 0, 0
	return true, nil
}

// apiZeroGrad clears the gradients unless a step is being accumulated
// (fewer than train.grad_accum backward passes), where it does nothing so
// that the usual loop body works with accumulation too.
func apiZeroGrad(h int64) error {
	s, err := getSession(h)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	if s.micro == 0 || s.micro < s.accum() {
		return nil
	}
	s.t.ZeroGrad()
	s.micro, s.lossSum = 0, 0
	return nil
}
