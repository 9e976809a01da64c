package main

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/optim"
)

// apiTrainStep runs a whole optimizer step on caller data: x and y hold the
// step's train.grad_accum micro-batches of train.batch_size sequences of
// model.block_size tokens, in order.
func apiTrainStep(h int64, x, y []int32) (float64, error) {
	s, err := getSession(h)
	if err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	if s.micro != 0 {
		return 0, fail(errState, "train_step: %d backward passes are pending; call step or zero_grad first", s.micro)
	}
	B, T, A := s.t.Cfg.Train.BatchSize, s.t.Cfg.Model.BlockSize, s.accum()
	if len(x) != A*B*T || len(y) != A*B*T {
		return 0, fail(errSize, "train_step: inputs hold %d and targets %d tokens, but a step is train.grad_accum*train.batch_size*model.block_size = %d*%d*%d = %d",
			len(x), len(y), A, B, T, A*B*T)
	}
	if s.t.Opt == nil {
		return 0, fail(errState, "train_step: the session has no optimizer; pass one to prepare")
	}
	n := B * T
	for a := 0; a < A; a++ {
		xt, yt, err := s.tokens(x[a*n:(a+1)*n], y[a*n:(a+1)*n], B, T)
		if err != nil {
			return 0, err
		}
		info := s.t.TrainPass(s.step, a)
		loss, err := s.t.Forward(xt, yt, info)
		if err != nil {
			return 0, wrap(errRuntime, err)
		}
		v := loss.Scalar()
		if err := s.t.Backward(loss, 1/float64(A), info); err != nil {
			return 0, wrap(errRuntime, err)
		}
		s.micro++
		s.lossSum += v
	}
	if _, err := s.update(); err != nil {
		return 0, err
	}
	return s.last.Loss, nil
}

// apiRunStep runs the next optimizer step on the session's data loader,
// exactly as `tinyacc train` does.
func apiRunStep(h int64) (float64, error) {
	s, err := getSession(h)
	if err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	if s.loader == nil || s.t.Opt == nil {
		return 0, fail(errState, "run_step: the session needs a data loader and an optimizer; pass both to prepare")
	}
	if s.micro != 0 {
		return 0, fail(errState, "run_step: %d backward passes are pending; call step or zero_grad first", s.micro)
	}
	m, err := s.t.Step(s.step)
	if err != nil {
		return 0, wrap(errRuntime, fmt.Errorf("step %d: %w", s.step, err))
	}
	s.last = &m
	s.step++
	return m.Loss, nil
}

// apiEvaluate returns the mean validation loss over train.eval_batches
// global batches (Trainer.Evaluate; every rank calls it).
func apiEvaluate(h int64) (float64, error) {
	s, err := getSession(h)
	if err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	if s.t.Val == nil {
		return 0, fail(errState, "evaluate: no validation data; pass a data loader to prepare and keep data.val_fraction above 0")
	}
	v, err := s.t.Evaluate()
	return v, wrap(errRuntime, err)
}

// apiClipGradNorm scales the accumulated gradients so their global norm is
// at most maxNorm (0 = only measure) and returns the norm before.
func apiClipGradNorm(h int64, maxNorm float64) (float64, error) {
	s, err := getSession(h)
	if err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	if maxNorm < 0 {
		return 0, fail(errInvalidArg, "clip_grad_norm: max norm %g must be >= 0 (0 only measures)", maxNorm)
	}
	if len(s.t.Plugins) > 0 {
		// Data-parallel gradients are averaged (or sharded) only inside
		// the step, so before it this rank's norm is not the global one.
		return 0, fail(errUnsupported, "clip_grad_norm: in a data-parallel session the gradients are averaged inside the step; set train.grad_clip instead, which clips the global norm there")
	}
	return optim.ClipGradNorm(s.t.Params(), maxNorm), nil
}

// Metrics are reported as a fixed array so the ABI needs no struct.
const numMetrics = 7

// apiMetrics returns the last optimizer step's metrics: step, loss, lr,
// grad_norm, tokens_per_s, step_ms, mfu.
func apiMetrics(h int64) ([numMetrics]float64, error) {
	s, err := getSession(h)
	if err != nil {
		return [numMetrics]float64{}, err
	}
	defer s.mu.Unlock()
	if s.last == nil {
		return [numMetrics]float64{}, fail(errState, "metrics: no optimizer step has run yet")
	}
	m := s.last
	return [numMetrics]float64{float64(m.Step), m.Loss, m.LR, m.GradNorm, m.TokensPerS, m.StepMS, m.MFU}, nil
}

// apiSessionState reports the next step index and the pending micro-batches.
func apiSessionState(h int64) (step, micro int, err error) {
	s, err := getSession(h)
	if err != nil {
		return 0, 0, err
	}
	defer s.mu.Unlock()
	return s.step, s.micro, nil
}

// apiSetStep moves the session to optimizer step step (resuming from a
// checkpoint: the schedule and the data position follow it).
func apiSetStep(h int64, step int) error {
	s, err := getSession(h)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	if step < 0 {
		return fail(errInvalidArg, "set_step: step %d must be >= 0", step)
	}
	if s.micro != 0 {
		return fail(errState, "set_step: %d backward passes are pending; call step or zero_grad first", s.micro)
	}
	s.step = step
	return nil
}

// apiSaveCheckpoint writes the session's training state under dir as a
// checkpoint of its current step (see trainer.SaveCheckpoint).
func apiSaveCheckpoint(h int64, dir string) error {
	s, err := getSession(h)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	if s.micro != 0 {
		return fail(errState, "save_checkpoint: %d backward passes are pending; call step or zero_grad first", s.micro)
	}
	world.Lock()
	defer world.Unlock()
	_, err = s.t.SaveCheckpoint(dir, s.step)
	return wrap(errIO, err)
}

// apiLoadCheckpoint loads the checkpoint at dir into the session and
// continues at its step.
func apiLoadCheckpoint(h int64, dir string) (int, error) {
	s, err := getSession(h)
	if err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	if s.micro != 0 {
		return 0, fail(errState, "load_checkpoint: %d backward passes are pending; call step or zero_grad first", s.micro)
	}
	d, err := ckpt.Resolve(dir)
	if err != nil {
		return 0, wrap(errIO, err)
	}
	world.Lock()
	defer world.Unlock()
	step, err := s.t.LoadCheckpoint(d)
	if err != nil {
		return 0, wrap(errIO, err)
	}
	s.step = step
	return step, nil
}
