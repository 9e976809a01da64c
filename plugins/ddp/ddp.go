package ddp

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
	"github.com/tinyacc/tinyacc/core/trace"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// Modes of gradient synchronisation (the values of ddp.mode).
const (
	Naive    = "naive"
	Bucketed = "bucketed"
)

// mib is the number of bytes in the unit of ddp.bucket_mb.
const mib = 1 << 20

// DDP is the data-parallel plugin of one rank. It implements
// trainer.Preparer, GradReadier, PreStepper and LossReducer.
type DDP struct {
	// Data is the group whose ranks read different samples (nil: the
	// reduction group). Under context parallel DDP averages gradients
	// over the DP × CP group, whose CP ranks read the same sequences
	// (their own chunks of them): Data is then the DP group.
	Data comm.Group

	// Reduce is the dtype gradients are reduced in (ddp.reduce_dtype):
	// Float32 (the default), or BFloat16, where each float32 gradient
	// bucket is rounded to bfloat16, all-reduced (summed in float32 and
	// rounded once, comm/half.go) and widened back: half the bytes on the
	// wire, gradients that carry bf16's 8 significant bits.
	Reduce tensor.DType

	g    comm.Group
	mode string
	// bucketBytes and firstBytes cap the buckets of the bucketed mode.
	bucketBytes, firstBytes int64

	// Set by Prepare in bucketed mode.
	buckets []*bucket
	slots   map[*tensor.Tensor]*slot
}

// New returns the data-parallel plugin over group g (the data-parallel
// group: all ranks, or one slice of a larger mesh). mode is Naive or
// Bucketed ("" means Bucketed). bucketMB and firstBucketMB are bucket caps
// in MiB; firstBucketMB = 0 means no separate first-bucket cap. They are
// ignored in naive mode.
func New(g comm.Group, mode string, bucketMB, firstBucketMB float64) (*DDP, error) {
	if g == nil {
		return nil, fmt.Errorf("ddp: no communication group (this rank is not in the data-parallel group)")
	}
	if mode == "" {
		mode = Bucketed
	}
	d := &DDP{g: g, mode: mode}
	switch mode {
	case Naive:
	case Bucketed:
		if !(bucketMB > 0) {
			return nil, fmt.Errorf("ddp: ddp.bucket_mb is %v; it must be positive (25 is a good default)", bucketMB)
		}
		if !(firstBucketMB >= 0) {
			return nil, fmt.Errorf("ddp: ddp.first_bucket_mb is %v; it must be positive, or 0 for no smaller first bucket", firstBucketMB)
		}
		if firstBucketMB == 0 {
			firstBucketMB = bucketMB
		}
		d.bucketBytes = max(1, int64(bucketMB*mib))
		d.firstBytes = max(1, int64(firstBucketMB*mib))
	default:
		return nil, fmt.Errorf("ddp: unknown ddp.mode %q; use %q or %q", mode, Naive, Bucketed)
	}
	return d, nil
}

// FromConfig is New with the ddp.* keys of cfg.
func FromConfig(g comm.Group, cfg config.Config) (*DDP, error) {
	d, err := New(g, cfg.DDP.Mode, cfg.DDP.BucketMB, cfg.DDP.FirstBucketMB)
	if err != nil {
		return nil, err
	}
	d.Reduce = ReduceDType(cfg)
	return d, nil
}

// ReduceDType is the dtype of ddp.reduce_dtype: BFloat16 for "bf16",
// Float32 otherwise.
func ReduceDType(cfg config.Config) tensor.DType {
	if cfg.DDP.ReduceDType == "bf16" {
		return tensor.BFloat16
	}
	return tensor.Float32
}

// halfWire reports whether gradients travel rounded to bfloat16: asked
// for, and the model's gradients are float32 (config validation refuses
// bf16 with float64 training).
func (d *DDP) halfWire(t *trainer.Trainer) bool {
	return d.Reduce == tensor.BFloat16 && t.DType() == tensor.Float32
}

// roundInto rounds the float32 src into the bfloat16 dst, to nearest even.
func roundInto(dst, src *tensor.Tensor) { cpu.BF16FromF32s(dst.U16(), src.F32()) }

// widenInto widens the bfloat16 src into the float32 dst (exact).
func widenInto(dst, src *tensor.Tensor) { cpu.BF16ToF32s(dst.F32(), src.U16()) }

// Name implements trainer.Plugin.
func (d *DDP) Name() string { return "ddp" }

// Mode is the synchronisation mode in use (Naive or Bucketed).
func (d *DDP) Mode() string { return d.mode }

// Prepare makes every replica start from rank 0's parameters, points this
// rank at its slice of the global batch and, in bucketed mode, lays the
// gradients out in their buckets.
func (d *DDP) Prepare(t *trainer.Trainer) error {
	data := d.g
	if d.Data != nil {
		data = d.Data
	}
	if dp := t.Cfg.Parallel.DP; dp > 0 && dp != data.Size() {
		return fmt.Errorf("ddp: parallel.dp is %d but data-parallel group %q has %d ranks; set parallel.dp to %d or 0",
			dp, data.Name(), data.Size(), data.Size())
	}
	// A described parameter (trainer.New) has no values yet: the trainer
	// fills it after Prepare from (seed, name, element index) or the
	// byte ranges of init_from, the same numbers on every rank. Values a
	// caller built (NewWith) are broadcast, so replicas start identical
	// whatever each caller loaded.
	for _, p := range replicated(t) {
		if !p.HasStorage() {
			continue
		}
		span := t.Trace.Begin("broadcast "+p.Name, "comm", trace.Comm).With("bytes", p.Bytes())
		err := d.g.Broadcast(p, 0)
		span.End()
		if err != nil {
			return fmt.Errorf("ddp: broadcast initial %s from rank 0: %w", p.Name, err)
		}
	}
	t.DataRank, t.DataSize = data.Rank(), data.Size()
	if d.mode == Bucketed {
		return d.layout(t)
	}
	return nil
}

// GradReady implements trainer.GradReadier: in bucketed mode it starts a
// bucket's all-reduce once its last gradient of the step is final.
func (d *DDP) GradReady(t *trainer.Trainer, p *tensor.Tensor, info tensor.PassInfo) error {
	if d.mode != Bucketed || !info.Last {
		return nil // naive, or an earlier micro-batch: accumulate only
	}
	return d.gradReady(t, p)
}

// PreStep implements trainer.PreStepper: once it returns, every gradient
// holds the average over the data-parallel ranks.
func (d *DDP) PreStep(t *trainer.Trainer) error {
	if d.mode == Naive {
		return d.allReduceEach(t)
	}
	return d.finishBuckets(t)
}

// ReduceLoss implements trainer.LossReducer: every rank's loss is its mean
// over equally many tokens (samples, or under context parallel equal
// chunks of the same samples), so the average of the ranks' losses is the
// mean over the global batch.
func (d *DDP) ReduceLoss(t *trainer.Trainer, loss float64) (float64, error) {
	return t.MeanOver(d.g, loss)
}
