package config

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDefaultsMatchDocumentedValues(t *testing.T) {
	d := Defaults()
	assert.Equal(t, [5]int{4, 4, 128, 128, 256},
		[5]int{d.Model.NLayer, d.Model.NHead, d.Model.NEmbd, d.Model.BlockSize, d.Model.VocabSize})
	tr := d.Train
	assert.Equal(t, []int{300, 8, 1, 20, 50, 4, 1, 0},
		[]int{tr.Steps, tr.BatchSize, tr.GradAccum, tr.WarmupSteps, tr.EvalEvery, tr.EvalBatches, tr.LogEvery, tr.Threads})
	assert.Equal(t, []float64{3e-4, 3e-5, 0.9, 0.95, 1e-8, 0.1, 0.9, 1.0, 2.5e11},
		[]float64{tr.LR, tr.MinLR, tr.Beta1, tr.Beta2, tr.Eps, tr.WeightDecay, tr.Momentum, tr.GradClip, tr.PeakFLOPS})
	assert.Equal(t, int64(1337), tr.Seed)
	assert.Equal(t, "cosine", tr.Schedule)
	assert.Equal(t, "adamw", tr.Optimizer)
	assert.Equal(t, "", d.Data.Path)
	assert.Equal(t, "sequential", d.Data.Order)
	assert.Equal(t, 0.1, d.Data.ValFraction)
	assert.Equal(t, int64(8388608), d.Data.MaxBytes)
	assert.Equal(t, "cpu", d.Device)
	assert.Equal(t, "", d.InitFrom)
	assert.Equal(t, "", d.SaveTo)
	assert.Equal(t, "", d.MetricsFile)
	require.NoError(t, d.Validate(), "the defaults must be a valid configuration")
}

func TestKeys(t *testing.T) {
	want := []string{
		"checkpoint.dir", "checkpoint.every", "checkpoint.keep_last",
		"comm.backend", "comm.timeout", "cp.attention", "cp.split",
		"data.format", "data.max_bytes", "data.order", "data.path", "data.val_fraction", "data.val_path",
		"ddp.bucket_mb", "ddp.first_bucket_mb", "ddp.mode", "ddp.process", "ddp.reduce_dtype",
		"device", "ep.dispatch", "init_from", "lora.alpha", "lora.dropout", "lora.rank", "lora.targets", "lora.train_biases", "memory.limit", "metrics_file",
		"model.arch", "model.block_size", "model.intermediate_size",
		"model.moe.aux_loss_coef", "model.moe.capacity_factor", "model.moe.every", "model.moe.experts", "model.moe.top_k", "model.moe.z_loss_coef",
		"model.n_embd", "model.n_head", "model.n_kv_head", "model.n_layer",
		"model.norm_eps", "model.rope_theta", "model.tie_embeddings", "model.vocab_size",
		"parallel.cp", "parallel.dp", "parallel.ep", "parallel.pp", "parallel.tp", "plugins.process",
		"pp.layers", "pp.schedule", "pp.virtual_stages",
		"recompute.blocks", "recompute.granularity", "recompute.modules",
		"resume", "resume_allow_nonfinite", "save_to", "tp.sequence_parallel", "trace", "trace_per_rank",
		"train.batch_size", "train.beta1", "train.beta2", "train.dtype", "train.eps", "train.eval_batches",
		"train.eval_every", "train.grad_accum", "train.grad_clip", "train.log_every", "train.loss_scale", "train.loss_scale_window", "train.lr",
		"train.min_lr", "train.mixed_precision", "train.momentum", "train.nonfinite", "train.nonfinite_max_skips", "train.optimizer", "train.peak_flops", "train.schedule",
		"train.seed", "train.steps", "train.threads", "train.warmup_steps", "train.weight_decay",
		"zero.stage", "zero.wrap",
	}
	assert.Equal(t, want, Keys())
}

// A new section, even a nested one, becomes keys without other changes.
func TestKeysFollowTheStruct(t *testing.T) {
	type ext struct {
		Zero struct {
			Stage   int `koanf:"stage"`
			Offload struct {
				On bool `koanf:"on"`
			} `koanf:"offload"`
		} `koanf:"zero"`
		Skipped int
		Name    string `koanf:"name"`
	}
	fs := buildFields(reflect.TypeOf(ext{}))
	var keys []string
	for _, f := range fs {
		keys = append(keys, f.key)
	}
	assert.Equal(t, []string{"name", "zero.offload.on", "zero.stage"}, keys)
	assert.Equal(t, []int{0, 1, 0}, fs[1].index)
	assert.Equal(t, map[string][]string{
		"":             {"name", "zero"},
		"zero":         {"offload", "stage"},
		"zero.offload": {"on"},
	}, buildChildren(fs))
}

func TestUnsupportedFieldTypePanics(t *testing.T) {
	type bad struct {
		List []int `koanf:"list"`
	}
	assert.PanicsWithValue(t,
		`config: field List (key "list") has type []int, which the loader cannot parse; use int, int64, float64, string, bool or time.Duration`,
		func() { buildFields(reflect.TypeOf(bad{})) })
}
