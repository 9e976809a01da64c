package trainer

import (
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// Mixed precision in the loop (train.mixed_precision). The parameters stay
// the float32 masters that the optimizer (sharded by ZeRO like any state)
// updates; the rank's allocator gets the compute dtype, so every op reads
// half-precision copies of them (tensor/precision.go), and gradients
// arrive and accumulate in float32.
//
// fp16 needs the loss scaled (config/precision.go): backward starts from
// scale·dL instead of dL, so gradients too small for fp16 stay
// representable. The step then unscales: the norm is divided by the scale
// and the clipping coefficient carries 1/scale. A gradient that overflowed
// on any rank (the flag travels in the gradient-norm all-reduce) makes
// every rank skip the step, leaving weights and moments untouched, and
// halves a dynamic scale; train.loss_scale_window good steps in a row
// double it.

// computeDType is the tensor compute dtype of train.mixed_precision.
func computeDType(cfg config.Config) tensor.DType {
	switch cfg.Train.MixedPrecision {
	case "bf16":
		return tensor.BFloat16
	case "fp16":
		return tensor.Float16
	}
	return tensor.Float32
}

// lossScaler is fp16's loss scale; nil under bf16 and full precision.
type lossScaler struct {
	scale   float64
	dynamic bool
	window  int
	good    int // good steps in a row since the last change
}

func newLossScaler(cfg config.Config) *lossScaler {
	if cfg.Train.MixedPrecision != "fp16" {
		return nil
	}
	if s, ok := cfg.LossScaleFixed(); ok {
		return &lossScaler{scale: s}
	}
	return &lossScaler{scale: config.DynamicLossScaleStart, dynamic: true, window: cfg.Train.LossScaleWindow}
}

// LossSeed is the gradient backward starts from for a loss weighted by w
// (1/grad_accum for one micro-batch): w times the loss scale. A step owner
// that seeds backward itself (a pipeline's last stage) uses it too.
func (t *Trainer) LossSeed(w float64) float64 {
	if t.scaler == nil {
		return w
	}
	return w * t.scaler.scale
}

// LossScale is the current fp16 loss scale; 0 without loss scaling.
func (t *Trainer) LossScale() float64 {
	if t.scaler == nil {
		return 0
	}
	return t.scaler.scale
}

// unscale takes the norm of the scaled gradients and returns the true norm
// and the factor the gradients must be multiplied by to undo the scale.
func (s *lossScaler) unscale(norm float64) (float64, float64) {
	if s == nil {
		return norm, 1
	}
	return norm / s.scale, 1 / s.scale
}

// update moves a dynamic scale after a step: halved after an overflow,
// doubled after window good steps in a row.
func (s *lossScaler) update(overflow bool) {
	if s == nil || !s.dynamic {
		return
	}
	if overflow {
		s.scale /= 2
		s.good = 0
		return
	}
	s.good++
	if s.good >= s.window {
		s.scale *= 2
		s.good = 0
	}
}
