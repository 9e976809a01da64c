package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Validate checks value ranges and cross-field rules that the type system
// cannot express. It reports every violation at once (joined, one per line),
// so a user fixes a config in one pass instead of one error per run. Checks
// are written as "!(ok)" so that NaN, which fails every comparison, is
// rejected too.
func (c *Config) Validate() error {
	v := &validator{}

	m := &c.Model
	v.positive("model.n_layer", int64(m.NLayer))
	v.positive("model.n_head", int64(m.NHead))
	v.positive("model.n_embd", int64(m.NEmbd))
	v.positive("model.block_size", int64(m.BlockSize))
	c.validateArch(v) // llama.go
	if m.NHead > 0 && m.NEmbd > 0 && m.NEmbd%m.NHead != 0 {
		v.addf("config: model.n_embd=%d is not divisible by model.n_head=%d: choose n_embd a multiple of n_head", m.NEmbd, m.NHead)
	}
	if m.VocabSize < 256 {
		v.addf("config: model.vocab_size=%d is too small: the byte tokenizer needs 256 tokens; set vocab_size >= 256", m.VocabSize)
	}

	t := &c.Train
	v.positive("train.steps", int64(t.Steps))
	v.positive("train.batch_size", int64(t.BatchSize))
	v.positive("train.grad_accum", int64(t.GradAccum))
	if !(t.LR > 0) {
		v.addf("config: train.lr=%s must be > 0: use a learning rate such as 3e-4", ff(t.LR))
	}
	// A bad lr is already reported; comparing min_lr with it would only add
	// a second message for the same mistake.
	if !(t.MinLR >= 0 && (!(t.LR > 0) || t.MinLR <= t.LR)) {
		v.addf("config: train.min_lr=%s must be in [0, train.lr=%s]: set min_lr between 0 and lr", ff(t.MinLR), ff(t.LR))
	}
	v.nonNegative("train.warmup_steps", int64(t.WarmupSteps))
	v.oneOf("train.schedule", t.Schedule, "constant", "cosine")
	v.oneOf("train.optimizer", t.Optimizer, "adamw", "sgd")
	v.unitInterval("train.beta1", t.Beta1, "such as 0.9")
	v.unitInterval("train.beta2", t.Beta2, "such as 0.95")
	if !(t.Eps > 0) {
		v.addf("config: train.eps=%s must be > 0: use a small value such as 1e-8", ff(t.Eps))
	}
	if !(t.WeightDecay >= 0) {
		v.addf("config: train.weight_decay=%s must be >= 0: use 0 to turn weight decay off", ff(t.WeightDecay))
	}
	v.unitInterval("train.momentum", t.Momentum, "such as 0.9, or 0 for plain SGD")
	if !(t.GradClip >= 0) {
		v.addf("config: train.grad_clip=%s must be >= 0: use 0 to turn clipping off", ff(t.GradClip))
	}
	v.nonNegative("train.eval_every", int64(t.EvalEvery))
	v.positive("train.eval_batches", int64(t.EvalBatches))
	v.positive("train.log_every", int64(t.LogEvery))
	if !(t.PeakFLOPS > 0) {
		v.addf("config: train.peak_flops=%s must be > 0: give the machine's peak FLOP/s, e.g. 1e11", ff(t.PeakFLOPS))
	}
	v.nonNegative("train.threads", int64(t.Threads))
	v.oneOf("train.nonfinite", t.NonFinite, "stop", "skip")
	v.positive("train.nonfinite_max_skips", int64(t.NonFiniteMaxSkips))
	v.oneOf("train.dtype", t.DType, "float32", "float64")
	c.validatePrecision(v) // precision.go

	d := &c.Data
	v.oneOf("data.order", d.Order, "sequential", "random")
	v.unitInterval("data.val_fraction", d.ValFraction, "such as 0.1, or 0 for no validation split")
	v.nonNegative("data.max_bytes", d.MaxBytes)
	v.oneOf("data.format", d.Format, "auto", "text", "tokens", "go_comments")
	if _, err := ParseMemoryLimit(c.Memory.Limit); err != nil {
		v.errs = append(v.errs, err)
	}

	pl := &c.Parallel
	v.nonNegative("parallel.dp", int64(pl.DP))
	for _, k := range []struct {
		key, plugin string
		n           int
	}{{"parallel.tp", "", pl.TP}, {"parallel.cp", "", pl.CP}, {"parallel.ep", "", pl.EP}} {
		if k.n < 1 {
			v.addf("config: %s=%d must be >= 1", k.key, k.n)
		} else if k.n > 1 && k.plugin != "" {
			v.addf("config: %s=%d: %s is not available in this build yet; set %s=1", k.key, k.n, k.plugin, k.key)
		}
	}
	c.validatePP(v) // pp.go
	if tp := pl.TP; tp > 1 {
		// Tensor parallel splits heads, the MLP width and the vocabulary
		// over tp ranks (plugins/tp); sequence parallel also the sequence.
		if m.NHead > 0 && m.NHead%tp != 0 {
			v.addf("config: model.n_head=%d is not divisible by parallel.tp=%d: tensor parallel gives every rank the same number of heads; choose n_head a multiple of tp", m.NHead, tp)
		}
		if m.NEmbd > 0 && m.NEmbd%tp != 0 {
			v.addf("config: model.n_embd=%d is not divisible by parallel.tp=%d: tensor parallel splits the width; choose n_embd a multiple of tp", m.NEmbd, tp)
		}
		if m.VocabSize > 0 && m.VocabSize < tp {
			v.addf("config: model.vocab_size=%d is smaller than parallel.tp=%d: every tensor-parallel rank holds some rows of the vocabulary", m.VocabSize, tp)
		}
		if c.TP.SequenceParallel && m.BlockSize > 0 && m.BlockSize%tp != 0 {
			v.addf("config: model.block_size=%d is not divisible by parallel.tp=%d: tp.sequence_parallel splits the sequence over the tp ranks; choose block_size a multiple of tp or set tp.sequence_parallel=false", m.BlockSize, tp)
		}
	}
	c.validateCP(v)        // cp.go
	c.validateMoE(v)       // moe.go
	c.validateRecompute(v) // recompute.go
	c.validateLoRA(v)      // lora.go
	v.oneOf("comm.backend", c.Comm.Backend, "tcp", "mpi", "local")
	if c.Comm.Timeout <= 0 {
		v.addf("config: comm.timeout=%s must be > 0: use a duration such as 5m", c.Comm.Timeout)
	}
	v.oneOf("ddp.mode", c.DDP.Mode, "naive", "bucketed")
	v.oneOf("ep.dispatch", c.EP.Dispatch, "alltoall", "allgather")
	if !(c.DDP.BucketMB > 0) || !(c.DDP.FirstBucketMB >= 0) {
		v.addf("config: ddp.bucket_mb=%s must be > 0 and ddp.first_bucket_mb=%s >= 0 (0: no smaller first bucket): use sizes such as 25 and 1", ff(c.DDP.BucketMB), ff(c.DDP.FirstBucketMB))
	}
	if c.Zero.Stage < 0 || c.Zero.Stage > 3 {
		v.addf("config: zero.stage=%d must be 0, 1, 2 or 3", c.Zero.Stage)
	}
	if c.DDP.Process && c.Zero.Stage != 0 {
		v.addf("config: ddp.process=true runs DDP in a plugin process, but zero.stage=%d picks ZeRO: set zero.stage=0 or ddp.process=false", c.Zero.Stage)
	}
	// The plugin process protocol shares float32 tensors only.
	if c.Train.DType == "float64" && (c.DDP.Process || len(c.Plugins.Process) > 0) {
		v.addf("config: train.dtype=float64 cannot run with plugin processes (ddp.process, plugins.process), which exchange float32 tensors: set train.dtype=float32 or run the plugins in-process")
	}

	switch {
	case c.Device == "cpu":
	case c.Device == "cuda" || strings.HasPrefix(c.Device, "cuda:"):
		v.addf("config: device=%q: this build has no GPU backend yet; use device=cpu", c.Device)
	default:
		v.addf("config: device=%q is not a known device: use device=cpu", c.Device)
	}

	v.nonNegative("checkpoint.every", int64(c.Checkpoint.Every))
	v.nonNegative("checkpoint.keep_last", int64(c.Checkpoint.KeepLast))
	if c.Resume == "auto" && c.Checkpoint.Dir == "" {
		v.addf("config: resume=auto looks for the latest checkpoint in checkpoint.dir, which is empty: set checkpoint.dir")
	}

	return errors.Join(v.errs...)
}

// validator accumulates violations so Validate can report all of them.
type validator struct {
	errs []error
}

func (v *validator) addf(format string, args ...any) {
	v.errs = append(v.errs, fmt.Errorf(format, args...))
}

func (v *validator) positive(key string, n int64) {
	if n <= 0 {
		v.addf("config: %s=%d must be positive: set it to 1 or more", key, n)
	}
}

func (v *validator) nonNegative(key string, n int64) {
	if n < 0 {
		v.addf("config: %s=%d must not be negative: set it to 0 or more", key, n)
	}
}

func (v *validator) unitInterval(key string, x float64, example string) {
	if !(x >= 0 && x < 1) {
		v.addf("config: %s=%s must be in [0, 1): use a value %s", key, ff(x), example)
	}
}

func (v *validator) oneOf(key, value string, allowed ...string) {
	for _, a := range allowed {
		if value == a {
			return
		}
	}
	v.addf("config: %s=%q is not supported: use one of %s", key, value, strings.Join(allowed, ", "))
}

// ff prints a float in its shortest exact form, matching what Show prints.
func ff(x float64) string {
	return strconv.FormatFloat(x, 'g', -1, 64)
}
