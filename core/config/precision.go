package config

import (
	"math"
	"strconv"
)

// Mixed precision (train.mixed_precision, the values Accelerate uses): "no"
// computes in train.dtype; "bf16" and "fp16" keep the float32 master
// weights, gradients and optimizer state, and run the matrix products on
// half-precision copies with float32 accumulation. fp16's narrow range
// (largest finite 65504, smallest normal 6e-5) needs the loss scaled
// before backward so small gradients do not flush to zero: train.loss_scale
// is "dynamic" (start high, halve on an overflow and skip that step, double
// after train.loss_scale_window good steps) or a fixed number. bf16 has
// float32's range and needs no scaling. ddp.reduce_dtype is the dtype data
// parallel reduces gradients in: "fp32" (the default), or "bf16": half the
// bytes, summed in float32 and rounded once.

// DynamicLossScaleStart is the first scale of dynamic fp16 loss scaling,
// 2^16 as in PyTorch's GradScaler and Megatron.
const DynamicLossScaleStart = 65536

// LossScaleFixed returns the fixed fp16 loss scale of train.loss_scale, or
// ok = false when it is "dynamic" (or mixed precision is not fp16).
func (c *Config) LossScaleFixed() (scale float64, ok bool) {
	if c.Train.MixedPrecision != "fp16" || c.Train.LossScale == "dynamic" {
		return 0, false
	}
	s, err := strconv.ParseFloat(c.Train.LossScale, 64)
	return s, err == nil
}

// validatePrecision checks train.mixed_precision and the loss scale keys.
func (c *Config) validatePrecision(v *validator) {
	t := &c.Train
	v.oneOf("train.mixed_precision", t.MixedPrecision, "no", "bf16", "fp16")
	if t.MixedPrecision != "no" && t.DType == "float64" {
		v.addf("config: train.mixed_precision=%s keeps float32 master weights, but train.dtype=float64: set train.dtype=float32, or train.mixed_precision=no for float64", t.MixedPrecision)
	}
	if t.LossScale != "dynamic" {
		s, err := strconv.ParseFloat(t.LossScale, 64)
		if err != nil || !(s > 0) || math.IsInf(s, 0) {
			v.addf("config: train.loss_scale=%q must be \"dynamic\" or a positive number such as 1024", t.LossScale)
		}
	}
	v.positive("train.loss_scale_window", int64(t.LossScaleWindow))
	v.oneOf("ddp.reduce_dtype", c.DDP.ReduceDType, "fp32", "bf16")
	if c.DDP.ReduceDType == "bf16" && t.DType == "float64" {
		v.addf("config: ddp.reduce_dtype=bf16 rounds float32 gradients, but train.dtype=float64: set ddp.reduce_dtype=fp32 for float64")
	}
}
