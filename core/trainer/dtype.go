package trainer

import (
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// DTypeOf is the precision cfg trains in (train.dtype): the dtype of the
// model's parameters, and so of everything derived from them — gradients,
// optimizer state, activations, communication buffers, checkpoints.
func DTypeOf(cfg config.Config) tensor.DType {
	if cfg.Train.DType == "float64" {
		return tensor.Float64
	}
	return tensor.Float32
}

// DType is the precision this trainer trains in; plugins allocate their
// buffers (flat gradient buckets, shards, stage inputs) in it.
func (t *Trainer) DType() tensor.DType { return DTypeOf(t.Cfg) }
