package config

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestValidateMessages(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(c *Config)
		want   string
	}{
		{"n_layer", func(c *Config) { c.Model.NLayer = 0 }, "config: model.n_layer=0 must be positive: set it to 1 or more"},
		{"n_head", func(c *Config) { c.Model.NHead = -1 }, "config: model.n_head=-1 must be positive: set it to 1 or more"},
		{"n_embd", func(c *Config) { c.Model.NEmbd = 0 }, "config: model.n_embd=0 must be positive: set it to 1 or more"},
		{"block_size", func(c *Config) { c.Model.BlockSize = 0 }, "config: model.block_size=0 must be positive: set it to 1 or more"},
		{"divisible", func(c *Config) { c.Model.NEmbd, c.Model.NHead = 100, 3 },
			"config: model.n_embd=100 is not divisible by model.n_head=3: choose n_embd a multiple of n_head"},
		{"vocab", func(c *Config) { c.Model.VocabSize = 255 },
			"config: model.vocab_size=255 is too small: the byte tokenizer needs 256 tokens; set vocab_size >= 256"},
		{"steps", func(c *Config) { c.Train.Steps = 0 }, "config: train.steps=0 must be positive: set it to 1 or more"},
		{"batch", func(c *Config) { c.Train.BatchSize = 0 }, "config: train.batch_size=0 must be positive: set it to 1 or more"},
		{"grad_accum", func(c *Config) { c.Train.GradAccum = -2 }, "config: train.grad_accum=-2 must be positive: set it to 1 or more"},
		{"lr zero", func(c *Config) { c.Train.LR, c.Train.MinLR = 0, 0 },
			"config: train.lr=0 must be > 0: use a learning rate such as 3e-4"},
		{"lr NaN", func(c *Config) { c.Train.LR, c.Train.MinLR = math.NaN(), 0 },
			"config: train.lr=NaN must be > 0: use a learning rate such as 3e-4"},
		{"min_lr above lr", func(c *Config) { c.Train.MinLR = 1e-3 },
			"config: train.min_lr=0.001 must be in [0, train.lr=0.0003]: set min_lr between 0 and lr"},
		{"min_lr negative", func(c *Config) { c.Train.MinLR = -1e-5 },
			"config: train.min_lr=-1e-05 must be in [0, train.lr=0.0003]: set min_lr between 0 and lr"},
		{"warmup", func(c *Config) { c.Train.WarmupSteps = -1 },
			"config: train.warmup_steps=-1 must not be negative: set it to 0 or more"},
		{"schedule", func(c *Config) { c.Train.Schedule = "linear" },
			`config: train.schedule="linear" is not supported: use one of constant, cosine`},
		{"optimizer", func(c *Config) { c.Train.Optimizer = "adam" },
			`config: train.optimizer="adam" is not supported: use one of adamw, sgd`},
		{"beta1", func(c *Config) { c.Train.Beta1 = 1 },
			"config: train.beta1=1 must be in [0, 1): use a value such as 0.9"},
		{"beta2", func(c *Config) { c.Train.Beta2 = -0.5 },
			"config: train.beta2=-0.5 must be in [0, 1): use a value such as 0.95"},
		{"eps", func(c *Config) { c.Train.Eps = 0 },
			"config: train.eps=0 must be > 0: use a small value such as 1e-8"},
		{"weight_decay", func(c *Config) { c.Train.WeightDecay = -0.1 },
			"config: train.weight_decay=-0.1 must be >= 0: use 0 to turn weight decay off"},
		{"momentum", func(c *Config) { c.Train.Momentum = 1.5 },
			"config: train.momentum=1.5 must be in [0, 1): use a value such as 0.9, or 0 for plain SGD"},
		{"grad_clip", func(c *Config) { c.Train.GradClip = -1 },
			"config: train.grad_clip=-1 must be >= 0: use 0 to turn clipping off"},
		{"eval_every", func(c *Config) { c.Train.EvalEvery = -5 },
			"config: train.eval_every=-5 must not be negative: set it to 0 or more"},
		{"eval_batches", func(c *Config) { c.Train.EvalBatches = 0 },
			"config: train.eval_batches=0 must be positive: set it to 1 or more"},
		{"dtype", func(c *Config) { c.Train.DType = "float16" },
			`config: train.dtype="float16" is not supported: use one of float32, float64`},
		{"dtype with a plugin process", func(c *Config) { c.Train.DType, c.DDP.Process = "float64", true },
			"config: train.dtype=float64 cannot run with plugin processes (ddp.process, plugins.process), which exchange float32 tensors: set train.dtype=float32 or run the plugins in-process"},
		{"mixed_precision", func(c *Config) { c.Train.MixedPrecision = "fp8" },
			`config: train.mixed_precision="fp8" is not supported: use one of no, bf16, fp16`},
		{"mixed precision in float64", func(c *Config) { c.Train.MixedPrecision, c.Train.DType = "bf16", "float64" },
			"config: train.mixed_precision=bf16 keeps float32 master weights, but train.dtype=float64: set train.dtype=float32, or train.mixed_precision=no for float64"},
		{"reduce_dtype", func(c *Config) { c.DDP.ReduceDType = "fp16" },
			`config: ddp.reduce_dtype="fp16" is not supported: use one of fp32, bf16`},
		{"reduce_dtype bf16 in float64", func(c *Config) { c.DDP.ReduceDType, c.Train.DType = "bf16", "float64" },
			"config: ddp.reduce_dtype=bf16 rounds float32 gradients, but train.dtype=float64: set ddp.reduce_dtype=fp32 for float64"},
		{"loss_scale word", func(c *Config) { c.Train.LossScale = "auto" },
			`config: train.loss_scale="auto" must be "dynamic" or a positive number such as 1024`},
		{"loss_scale zero", func(c *Config) { c.Train.LossScale = "0" },
			`config: train.loss_scale="0" must be "dynamic" or a positive number such as 1024`},
		{"loss_scale inf", func(c *Config) { c.Train.LossScale = "inf" },
			`config: train.loss_scale="inf" must be "dynamic" or a positive number such as 1024`},
		{"loss_scale_window", func(c *Config) { c.Train.LossScaleWindow = 0 },
			"config: train.loss_scale_window=0 must be positive: set it to 1 or more"},
		{"log_every", func(c *Config) { c.Train.LogEvery = 0 },
			"config: train.log_every=0 must be positive: set it to 1 or more"},
		{"peak_flops", func(c *Config) { c.Train.PeakFLOPS = 0 },
			"config: train.peak_flops=0 must be > 0: give the machine's peak FLOP/s, e.g. 1e11"},
		{"threads", func(c *Config) { c.Train.Threads = -1 },
			"config: train.threads=-1 must not be negative: set it to 0 or more"},
		{"order", func(c *Config) { c.Data.Order = "shuffled" },
			`config: data.order="shuffled" is not supported: use one of sequential, random`},
		{"val_fraction", func(c *Config) { c.Data.ValFraction = 1 },
			"config: data.val_fraction=1 must be in [0, 1): use a value such as 0.1, or 0 for no validation split"},
		{"max_bytes", func(c *Config) { c.Data.MaxBytes = -1 },
			"config: data.max_bytes=-1 must not be negative: set it to 0 or more"},
		{"data.format", func(c *Config) { c.Data.Format = "bin" },
			`config: data.format="bin" is not supported: use one of auto, text, tokens, go_comments`},
		{"memory.limit", func(c *Config) { c.Memory.Limit = "lots" },
			`config: memory.limit="lots" is not a size: use auto, 0 (no check) or a size such as 4GiB or 512MiB`},
		{"tp", func(c *Config) { c.Parallel.TP = 0 },
			"config: parallel.tp=0 must be >= 1"},
		{"tp heads", func(c *Config) { c.Parallel.TP, c.Model.NHead, c.Model.NEmbd = 4, 6, 96 },
			"config: model.n_head=6 is not divisible by parallel.tp=4: tensor parallel gives every rank the same number of heads; choose n_head a multiple of tp"},
		{"tp embedding", func(c *Config) { c.Parallel.TP, c.Model.NHead, c.Model.NEmbd = 3, 3, 100 },
			"config: model.n_embd=100 is not divisible by model.n_head=3: choose n_embd a multiple of n_head\n" +
				"config: model.n_embd=100 is not divisible by parallel.tp=3: tensor parallel splits the width; choose n_embd a multiple of tp"},
		{"tp vocabulary", func(c *Config) { c.Parallel.TP, c.Model.NHead, c.Model.NEmbd, c.Model.VocabSize = 512, 512, 512, 300 },
			"config: model.vocab_size=300 is smaller than parallel.tp=512: every tensor-parallel rank holds some rows of the vocabulary"},
		{"sequence parallel", func(c *Config) { c.Parallel.TP, c.TP.SequenceParallel, c.Model.BlockSize = 2, true, 129 },
			"config: model.block_size=129 is not divisible by parallel.tp=2: tp.sequence_parallel splits the sequence over the tp ranks; choose block_size a multiple of tp or set tp.sequence_parallel=false"},
		{"cp contiguous", func(c *Config) { c.Parallel.CP, c.CP.Split, c.Model.BlockSize = 3, "contiguous", 16 },
			"config: model.block_size=16 is not divisible by parallel.cp=3: context parallel cuts every sequence into equal chunks; choose block_size a multiple of 3"},
		{"cp zigzag", func(c *Config) { c.Parallel.CP, c.Model.BlockSize = 4, 20 },
			"config: model.block_size=20 is not divisible by 2 × parallel.cp=4 (cp.split=zigzag: two chunks per rank) = 8: context parallel cuts every sequence into equal chunks; choose block_size a multiple of 8"},
		{"cp zigzag sequence parallel", func(c *Config) {
			c.Parallel.CP, c.Parallel.TP, c.TP.SequenceParallel, c.Model.BlockSize = 2, 2, true, 20
		},
			"config: model.block_size=20 is not divisible by 2 × parallel.cp=2 (cp.split=zigzag: two chunks per rank) × parallel.tp=2 (tp.sequence_parallel splits a rank's rows again) = 8: context parallel cuts every sequence into equal chunks; choose block_size a multiple of 8"},
		{"cp attention", func(c *Config) { c.CP.Attention = "ulysses" },
			`config: cp.attention="ulysses" is not supported: use one of ring, allgather`},
		{"cp split", func(c *Config) { c.CP.Split = "striped" },
			`config: cp.split="striped" is not supported: use one of zigzag, contiguous`},
		{"dp", func(c *Config) { c.Parallel.DP = -1 },
			"config: parallel.dp=-1 must not be negative: set it to 0 or more"},
		{"backend", func(c *Config) { c.Comm.Backend = "nccl" },
			`config: comm.backend="nccl" is not supported: use one of tcp, mpi, local`},
		{"timeout", func(c *Config) { c.Comm.Timeout = 0 },
			"config: comm.timeout=0s must be > 0: use a duration such as 5m"},
		{"ddp mode", func(c *Config) { c.DDP.Mode = "fast" },
			`config: ddp.mode="fast" is not supported: use one of naive, bucketed`},
		{"bucket", func(c *Config) { c.DDP.BucketMB = 0 },
			"config: ddp.bucket_mb=0 must be > 0 and ddp.first_bucket_mb=1 >= 0 (0: no smaller first bucket): use sizes such as 25 and 1"},
		{"first bucket", func(c *Config) { c.DDP.FirstBucketMB = -1 },
			"config: ddp.bucket_mb=25 must be > 0 and ddp.first_bucket_mb=-1 >= 0 (0: no smaller first bucket): use sizes such as 25 and 1"},
		{"checkpoint every", func(c *Config) { c.Checkpoint.Every = -1 },
			"config: checkpoint.every=-1 must not be negative: set it to 0 or more"},
		{"resume auto", func(c *Config) { c.Resume = "auto" },
			"config: resume=auto looks for the latest checkpoint in checkpoint.dir, which is empty: set checkpoint.dir"},
		{"zero", func(c *Config) { c.Zero.Stage = 4 },
			"config: zero.stage=4 must be 0, 1, 2 or 3"},
		{"cuda", func(c *Config) { c.Device = "cuda" },
			`config: device="cuda": this build has no GPU backend yet; use device=cpu`},
		{"cuda:1", func(c *Config) { c.Device = "cuda:1" },
			`config: device="cuda:1": this build has no GPU backend yet; use device=cpu`},
		{"unknown device", func(c *Config) { c.Device = "tpu" },
			`config: device="tpu" is not a known device: use device=cpu`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := Defaults()
			c.mutate(&cfg)
			err := cfg.Validate()
			require.Error(t, err)
			assert.Equal(t, c.want, err.Error())
		})
	}
}

func TestValidateAcceptsBoundaries(t *testing.T) {
	c := Defaults()
	c.Train.MinLR = c.Train.LR // min_lr may equal lr (a constant schedule)
	c.Train.WarmupSteps = 0
	c.Train.Beta1, c.Train.Beta2, c.Train.Momentum = 0, 0, 0
	c.Train.GradClip, c.Train.WeightDecay = 0, 0
	c.Train.EvalEvery, c.Train.Threads = 0, 0
	c.Data.ValFraction = 0
	c.Model.NHead, c.Model.NEmbd = 1, 7
	c.Model.VocabSize = 256
	c.Train.Schedule, c.Train.Optimizer, c.Data.Order = "constant", "sgd", "random"
	assert.NoError(t, c.Validate())
}

func TestValidateReportsAllErrors(t *testing.T) {
	c := Defaults()
	c.Model.NEmbd, c.Model.NHead = 100, 3
	c.Train.Schedule = "step"
	c.Data.ValFraction = -0.1
	c.Device = "cuda"
	err := c.Validate()
	require.Error(t, err)
	assert.Equal(t, []string{
		"config: model.n_embd=100 is not divisible by model.n_head=3: choose n_embd a multiple of n_head",
		`config: train.schedule="step" is not supported: use one of constant, cosine`,
		"config: data.val_fraction=-0.1 must be in [0, 1): use a value such as 0.1, or 0 for no validation split",
		`config: device="cuda": this build has no GPU backend yet; use device=cpu`,
	}, strings.Split(err.Error(), "\n"))
}

// TestFirstBucketZeroMeansNoSmallerBucket: the validator accepts what
// ddp.New documents, ddp.first_bucket_mb=0 for "no separate first bucket".
func TestFirstBucketZeroMeansNoSmallerBucket(t *testing.T) {
	cfg := Defaults()
	cfg.DDP.FirstBucketMB = 0
	require.NoError(t, cfg.Validate())
}

func TestLossScaleFixed(t *testing.T) {
	c := Defaults()
	_, ok := c.LossScaleFixed()
	require.False(t, ok, "no mixed precision: no scale")
	c.Train.MixedPrecision, c.Train.LossScale = "fp16", "1024"
	require.NoError(t, c.Validate())
	s, ok := c.LossScaleFixed()
	require.True(t, ok)
	require.Equal(t, 1024.0, s)
	c.Train.LossScale = "dynamic"
	_, ok = c.LossScaleFixed()
	require.False(t, ok)
	c.Train.MixedPrecision = "bf16"
	require.NoError(t, c.Validate())
}
