// Package config resolves a tinyacc run configuration from layered sources.
//
// Four layers are read, lowest precedence first:
//
//  1. built-in defaults (Defaults),
//  2. a YAML file (the CLI's --config FILE; JSON is accepted too),
//  3. environment variables with the TINYACC_ prefix, where "__" separates
//     sections and the name is lower-cased (TINYACC_TRAIN__LR=1e-3 sets
//     train.lr),
//  4. command-line flags, --key=value or --key value (--model.n_layer=2).
//
// Every layer is checked on its own before anything is merged: a key that the
// Config struct does not have, or a value of the wrong type, is an error that
// names the key, the value and the layer it came from. Bad configurations are
// meant to fail here, before any process starts, rather than deep inside a
// run. The layers are kept apart so that Resolved.Sources and Resolved.Show
// can tell where each effective value came from.
//
// The set of keys is derived from the Config struct by reflection on its
// koanf tags, so adding a field (or a whole section such as parallel.* or
// zero.*) adds a key with loading, type checking, flags, environment
// variables and Show support; only its range checks belong in Validate.
package config

import "time"

// Config is the complete, typed configuration of one training run. The koanf
// tags are the key names used in files, environment variables and flags;
// nested structs are sections ("model.n_layer").
type Config struct {
	Model struct {
		NLayer    int `koanf:"n_layer"`    // transformer blocks
		NHead     int `koanf:"n_head"`     // attention heads per block
		NEmbd     int `koanf:"n_embd"`     // residual stream width
		BlockSize int `koanf:"block_size"` // context length in tokens
		VocabSize int `koanf:"vocab_size"` // at least 256 for the byte tokenizer
		// MoE makes feed-forward layers mixtures of experts (docs/moe.md).
		MoE struct {
			Experts        int     `koanf:"experts"`         // experts per MoE block; 0 = dense
			TopK           int     `koanf:"top_k"`           // experts per token
			Every          int     `koanf:"every"`           // every k-th block is MoE
			CapacityFactor float64 `koanf:"capacity_factor"` // 0 = dropless
			AuxLossCoef    float64 `koanf:"aux_loss_coef"`   // load-balancing loss weight
			ZLossCoef      float64 `koanf:"z_loss_coef"`     // router z-loss weight
		} `koanf:"moe"`
		// Arch is "gpt2" or "llama"; the keys below are llama's (see
		// llama.go for their rules).
		Arch             string  `koanf:"arch"`
		NKVHead          int     `koanf:"n_kv_head"`         // grouped-query attention; 0 = n_head
		IntermediateSize int     `koanf:"intermediate_size"` // SwiGLU width; 0 = 8/3 n_embd rounded up to 64
		RopeTheta        float64 `koanf:"rope_theta"`        // rotary base
		NormEps          float64 `koanf:"norm_eps"`          // RMSNorm epsilon
		TieEmbeddings    bool    `koanf:"tie_embeddings"`    // lm_head tied to embed_tokens
	} `koanf:"model"`
	Train struct {
		Steps       int     `koanf:"steps"`        // optimizer steps
		BatchSize   int     `koanf:"batch_size"`   // per-rank micro-batch
		GradAccum   int     `koanf:"grad_accum"`   // micro-batches per optimizer step
		LR          float64 `koanf:"lr"`           // peak learning rate
		MinLR       float64 `koanf:"min_lr"`       // floor of the cosine schedule
		WarmupSteps int     `koanf:"warmup_steps"` // linear warmup length
		Schedule    string  `koanf:"schedule"`     // "constant" | "cosine"
		Optimizer   string  `koanf:"optimizer"`    // "adamw" | "sgd"
		Beta1       float64 `koanf:"beta1"`        // AdamW first-moment decay
		Beta2       float64 `koanf:"beta2"`        // AdamW second-moment decay
		Eps         float64 `koanf:"eps"`          // AdamW denominator guard
		WeightDecay float64 `koanf:"weight_decay"` // decoupled weight decay
		Momentum    float64 `koanf:"momentum"`     // SGD momentum
		GradClip    float64 `koanf:"grad_clip"`    // global-norm clip; 0 = off
		Seed        int64   `koanf:"seed"`         // drives init and data order
		EvalEvery   int     `koanf:"eval_every"`   // steps between evals; 0 = only at the end
		EvalBatches int     `koanf:"eval_batches"` // batches per evaluation
		LogEvery    int     `koanf:"log_every"`    // steps between log lines
		PeakFLOPS   float64 `koanf:"peak_flops"`   // peak FLOP/s used for MFU
		Threads     int     `koanf:"threads"`      // compute threads per rank; 0 = all cores
		// NonFinite decides what a non-finite loss or gradient norm does:
		// "stop" ends the run, "skip" drops that step's update.
		NonFinite         string `koanf:"nonfinite"`
		NonFiniteMaxSkips int    `koanf:"nonfinite_max_skips"` // consecutive skipped steps before stopping
		// DType is the precision of the parameters, gradients, optimizer
		// state and activations: "float32", or "float64", which exists for
		// tests: it puts rounding noise far below any real difference, so
		// every layout can be held to one process at 1e-9.
		DType string `koanf:"dtype"`
		// MixedPrecision is "no" (everything in train.dtype), "bf16" or
		// "fp16": matrix products take half-precision copies of the
		// float32 master weights and accumulate in float32 (precision.go).
		MixedPrecision  string `koanf:"mixed_precision"`
		LossScale       string `koanf:"loss_scale"`        // fp16: "dynamic" or a fixed positive number
		LossScaleWindow int    `koanf:"loss_scale_window"` // fp16 dynamic: good steps before the scale doubles
	} `koanf:"train"`
	Data struct {
		Path        string  `koanf:"path"`         // "" = default corpus (Go sources of GOROOT)
		Order       string  `koanf:"order"`        // "sequential" | "random"
		ValFraction float64 `koanf:"val_fraction"` // share held out for evaluation, in [0,1)
		MaxBytes    int64   `koanf:"max_bytes"`    // cap on text corpus bytes read; 0 = no cap
		// Format says how data.path is read: "text" (byte tokenizer),
		// "tokens" (llm.c .bin shards), "auto" (a shard header decides) or
		// "go_comments" (the doc comments of its Go files, GOROOT/src's when
		// data.path is "", as text: prose wherever Go is installed).
		Format  string `koanf:"format"`
		ValPath string `koanf:"val_path"` // separate validation shards (glob); "" = hold out data.val_fraction
	} `koanf:"data"`
	Memory struct {
		// Limit is the memory a training job may use on this host, against
		// which the estimate is checked before any work: "auto" (the
		// cgroup limit, else MemAvailable), a size such as 4GiB, or 0 (no
		// check).
		Limit string `koanf:"limit"`
	} `koanf:"memory"`
	Parallel struct {
		DP int `koanf:"dp"` // data-parallel ranks; 0 = world size / (tp·cp·pp)
		TP int `koanf:"tp"` // tensor-parallel ranks
		PP int `koanf:"pp"` // pipeline stages
		CP int `koanf:"cp"` // context-parallel ranks
		// EP splits the experts of each MoE block over groups of ep
		// data-parallel ranks (plugins/ep); 1 = every rank holds every expert.
		EP int `koanf:"ep"`
	} `koanf:"parallel"`
	PP struct {
		Schedule      string `koanf:"schedule"`       // "afab" | "1f1b" | "interleaved" | "zb1"
		VirtualStages int    `koanf:"virtual_stages"` // model chunks per rank (interleaved)
		Layers        string `koanf:"layers"`         // blocks per chunk, e.g. "3,3,2"; "" = balanced by compute
	} `koanf:"pp"`
	TP struct {
		// SequenceParallel splits the activations of the LayerNorm regions
		// along the sequence over the TP group (all-gathers and
		// reduce-scatters instead of all-reduces); needs
		// model.block_size % parallel.tp == 0. Ignored when tp is 1.
		SequenceParallel bool `koanf:"sequence_parallel"`
	} `koanf:"tp"`
	CP struct {
		// Attention is how a context-parallel rank sees the other ranks'
		// keys and values: "ring" passes them around the CP group block by
		// block, overlapped with compute; "allgather" gathers them all.
		Attention string `koanf:"attention"`
		// Split is how a sequence is cut over the CP ranks: "zigzag"
		// (2·cp chunks, rank r holds r and 2·cp-1-r: causal work balanced)
		// or "contiguous" (rank r holds chunk r).
		Split string `koanf:"split"`
	} `koanf:"cp"`
	Recompute struct {
		// Granularity is what the backward forms again instead of keeping
		// it from the forward: "none", "selective" (the activations named
		// by recompute.modules) or "full" (a block keeps only its input
		// and runs its forward again in backward).
		Granularity string   `koanf:"granularity"`
		Modules     []string `koanf:"modules"` // selective: any of norm, mlp_act, attn_core
		Blocks      int      `koanf:"blocks"`  // full: the first N blocks of each stage recompute; 0 = all
	} `koanf:"recompute"`
	LoRA struct {
		// Rank is the adapters' inner width; 0 trains every weight
		// (docs/lora.md).
		Rank        int      `koanf:"rank"`
		Alpha       float64  `koanf:"alpha"`        // the update is scaled by alpha/rank
		Dropout     float64  `koanf:"dropout"`      // dropout on the adapters' input
		Targets     []string `koanf:"targets"`      // module names; default the attention's (c_attn; q_proj, v_proj)
		TrainBiases string   `koanf:"train_biases"` // "none", or "all": the base's biases train too
	} `koanf:"lora"`
	Comm struct {
		Backend string        `koanf:"backend"` // "tcp" between processes, "mpi" through an installed MPI, "local" for goroutine ranks
		Timeout time.Duration `koanf:"timeout"` // deadline of every blocking communication
	} `koanf:"comm"`
	EP struct {
		// Dispatch is how expert parallel moves tokens to their experts:
		// "alltoall" sends each row to the rank holding its expert and back
		// (AllToAllV); "allgather", the naive form, gathers every rank's
		// tokens on every rank and reduce-scatters the experts' outputs.
		Dispatch string `koanf:"dispatch"`
	} `koanf:"ep"`
	DDP struct {
		Mode          string  `koanf:"mode"`            // "naive" | "bucketed"
		BucketMB      float64 `koanf:"bucket_mb"`       // bucket size in MiB
		FirstBucketMB float64 `koanf:"first_bucket_mb"` // the first (last layers') bucket, smaller to start early
		Process       bool    `koanf:"process"`         // run DDP in a plugin process (tensors through shared memory)
		ReduceDType   string  `koanf:"reduce_dtype"`    // "fp32" | "bf16": the dtype gradients are reduced in
	} `koanf:"ddp"`
	Plugins struct {
		Process []string `koanf:"process"` // plugin binaries to run as processes, in order
	} `koanf:"plugins"`
	Zero struct {
		Stage int `koanf:"stage"` // 0 = plain data parallel, 1/2/3 = ZeRO stage
		// Wrap names the module classes that are ZeRO-3 units of a torch
		// model (Python); empty = each direct child module, with the
		// root's own parameters as one more unit.
		Wrap []string `koanf:"wrap"`
	} `koanf:"zero"`
	Checkpoint struct {
		Dir      string `koanf:"dir"`       // where step-NNNNNNN/ checkpoints go; "" = none
		Every    int    `koanf:"every"`     // steps between checkpoints; 0 = only at the end
		KeepLast int    `koanf:"keep_last"` // keep the N newest; 0 = keep all
	} `koanf:"checkpoint"`
	Resume               string `koanf:"resume"`                 // checkpoint (or root of checkpoints) to continue; "auto" = the latest in checkpoint.dir if any
	ResumeAllowNonfinite bool   `koanf:"resume_allow_nonfinite"` // accept NaN or Inf weights when resuming
	Device               string `koanf:"device"`                 // "cpu"; GPU devices are rejected until a backend exists
	InitFrom             string `koanf:"init_from"`              // safetensors file to start from; "" = fresh init
	SaveTo               string `koanf:"save_to"`                // safetensors file to write; "" = don't save
	MetricsFile          string `koanf:"metrics_file"`           // JSON-lines metrics; "" = none
	Trace                string `koanf:"trace"`                  // one merged Perfetto trace, a process track per rank; "" = off
	TracePerRank         bool   `koanf:"trace_per_rank"`         // also keep one trace file per rank

	// Declared holds the values of keys that process plugins declare in
	// their handshake ("nonfinite_guard.max_skips"), each in its canonical
	// text form; see LoadWith. Nil when no plugin declared any.
	Declared map[string]string `koanf:"-"`
}

// Defaults returns the built-in configuration: a small GPT that trains in
// minutes on a CPU, so that a bare `tinyacc train` does something useful.
func Defaults() Config {
	var c Config

	c.Model.NLayer = 4
	c.Model.NHead = 4
	c.Model.NEmbd = 128
	c.Model.BlockSize = 128
	c.Model.VocabSize = 256
	c.Model.MoE.TopK, c.Model.MoE.Every, c.Model.MoE.AuxLossCoef = 2, 1, 0.01
	c.Model.Arch = "gpt2"
	c.Model.TieEmbeddings = true // gpt2's; a llama's default is false (resolveTie)
	c.Model.RopeTheta = 10000
	c.Model.NormEps = 1e-5

	c.Train.Steps = 300
	c.Train.BatchSize = 8
	c.Train.GradAccum = 1
	c.Train.LR = 3e-4
	c.Train.MinLR = 3e-5
	c.Train.WarmupSteps = 20
	c.Train.Schedule = "cosine"
	c.Train.Optimizer = "adamw"
	c.Train.Beta1 = 0.9
	c.Train.Beta2 = 0.95
	c.Train.Eps = 1e-8
	c.Train.WeightDecay = 0.1
	c.Train.Momentum = 0.9
	c.Train.GradClip = 1.0
	c.Train.Seed = 1337
	c.Train.EvalEvery = 50
	c.Train.EvalBatches = 4
	c.Train.LogEvery = 1
	c.Train.PeakFLOPS = 2.5e11 // about the fp32 FMA peak of two current x86 cores
	c.Train.Threads = 0
	c.Train.NonFinite = "stop"
	c.Train.NonFiniteMaxSkips = 10
	c.Train.DType = "float32"
	c.Train.MixedPrecision = "no"
	c.Train.LossScale = "dynamic"
	c.Train.LossScaleWindow = 1000

	c.Data.Path = ""
	c.Data.Order = "sequential"
	c.Data.ValFraction = 0.1
	c.Data.MaxBytes = 8 << 20
	c.Data.Format = "auto"
	c.Memory.Limit = "auto"

	c.Parallel.DP, c.Parallel.TP, c.Parallel.PP, c.Parallel.CP, c.Parallel.EP = 0, 1, 1, 1, 1
	c.PP.Schedule, c.PP.VirtualStages = "1f1b", 1
	c.CP.Attention, c.CP.Split = "ring", "zigzag"
	c.Recompute.Granularity, c.Recompute.Modules = "none", []string{"norm", "mlp_act"}
	c.LoRA.Alpha, c.LoRA.Targets, c.LoRA.TrainBiases = 16, DefaultLoRATargets("gpt2"), "none"
	c.Comm.Backend = "tcp"
	c.Comm.Timeout = 5 * time.Minute
	c.DDP.Mode = "bucketed"
	c.EP.Dispatch = "alltoall"
	c.DDP.BucketMB = 25
	c.DDP.FirstBucketMB = 1
	c.DDP.ReduceDType = "fp32"
	c.Zero.Stage = 0

	c.Device = "cpu"
	return c
}

// Reserved is the one table of TINYACC_ variables that are not config
// keys: they steer the process (launcher, library loading, debugging, the
// build) rather than the run, and are never read as configuration. The
// README's table of variables is this table; any other TINYACC_ variable
// is a config key or an error that suggests the nearest name.
var Reserved = []ReservedVar{
	{"TINYACC_SHM", "0/false keeps transfers between local ranks on TCP; 1/true (default) moves payloads through /dev/shm"},
	{"TINYACC_DEBUG", "detail: ranks agree on each collective before running it and report both sides of a mismatch"},
	{"TINYACC_LIB", "the libtinyacc.so the Python package loads (default: the one beside it)"},
	{"TINYACC_TOKEN", "the secret a C or Python rank group presents when it connects"},
	{"TINYACC_JOB_TOKEN", "the per-job secret the launcher gives every rank of a job"},
	{"TINYACC_LOCAL_RANK", "set by the launcher: the rank's index on its host"},
	{"TINYACC_RESTART", "set by the launcher: how many times the job was restarted"},
	{"TINYACC_PLUGIN", "set by the host: the handshake cookie of a plugin process"},
	{"TINYACC_PLUGIN_BUILTIN", "set by the host: which compiled-in plugin tinyacc serves as a plugin process"},
	{"TINYACC_GO", "the go command the Makefile and the README test build with"},
	{"TINYACC_README_STEPS", "the step count the README test turns the README's examples down to"},
	{"TINYACC_README_TEST", "1 runs the README test (make test-readme); go test ./... skips it"},
	{"TINYACC_BF16_KERNEL", "off: bf16 matrix products take the portable path (float32 products of the widened operands) on a CPU with AVX512-BF16 too; on (default) uses the kernel where the CPU has it"},
	{"TINYACC_HOST_ID", "overrides the host identity that decides which ranks share memory (ranks in separate network namespaces of one machine)"},
}

// ReservedVar is one row of Reserved.
type ReservedVar struct{ Name, Meaning string }

// ReservedEnv is the names of Reserved.
var ReservedEnv = func() []string {
	out := make([]string, len(Reserved))
	for i, r := range Reserved {
		out[i] = r.Name
	}
	return out
}()

// EnvPrefix is the prefix of environment variables that carry configuration.
const EnvPrefix = "TINYACC_"
