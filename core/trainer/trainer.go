// Package trainer runs the training loop — forward, backward, optimizer
// step — and calls the plugins' hooks around it:
//
//	batch --PreForward--> forward --> backward (GradReady per parameter)
//	      --PostGrad--> [next micro-batch...] --PreStep--> clip, optimizer
//	      --PostStep--> metrics
//
// Everything a parallel strategy needs is reachable from the Trainer it is
// given: the model, the optimizer, the data position of this rank, the
// allocator that accounts this rank's memory.
package trainer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"reflect"
	"slices"
	"time"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/data"
	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/optim"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
	"github.com/tinyacc/tinyacc/core/trace"
)

// Options are what the caller provides besides the config.
type Options struct {
	Plugins []Plugin
	// Log receives progress and summaries (nil = io.Discard). Live is
	// whether it is a terminal (a rewritten progress line) or a file/pipe
	// (plain lines).
	Log  io.Writer
	Live bool
	// Rank and World identify this process among all ranks; only rank 0
	// writes the metrics file and logs.
	Rank, World int
	// Mesh is this rank's place on the pp × dp × cp × tp grid (pp
	// outermost, tp innermost, as core/mesh lays ranks out) and its groups
	// (nil for a single process). The trainer uses its world group
	// for what involves every rank: the gradient norm, gathering a
	// parameter through its placement, the memory reports.
	Mesh *mesh.Mesh
	// Alloc accounts this rank's memory (nil = tensor.Default).
	Alloc *tensor.Allocator
	// Train and Val override the corpus of cfg.Data (tests, bindings).
	Train, Val []int32
	// Corpus describes where the tokens came from, for the log.
	Corpus string
	// Trace records forward, backward and optimizer spans (nil = off);
	// plugins add their collectives to it.
	Trace *trace.Recorder
	// OnStep, when set, receives every step's metrics as Run produces them
	// (Run's result keeps only a summary).
	OnStep func(StepMetrics)
	// OnEval, when set, receives every evaluation as Run produces it
	// (Run's result keeps only the last).
	OnEval func(EvalPoint)
}

// StepMetrics is what one optimizer step reports.
type StepMetrics struct {
	// Step is the number of optimizer steps completed, this one included:
	// the first step is 1, on the console, in metrics_file, in the
	// bindings' last metrics and in checkpoint names alike.
	Step       int     `json:"step"`
	Loss       float64 `json:"loss"`
	LR         float64 `json:"lr"`
	GradNorm   float64 `json:"grad_norm"`
	TokensPerS float64 `json:"tokens_per_s"`
	StepMS     float64 `json:"step_ms"`
	MFU        float64 `json:"mfu"`
	// Skipped marks a step whose update train.nonfinite=skip dropped.
	Skipped bool `json:"skipped,omitempty"`
	// LossScale is fp16's loss scale after the step (precision.go); absent
	// without loss scaling.
	LossScale float64 `json:"loss_scale,omitempty"`
	// CommBytes is the payload this rank sent during the step, on every
	// group (comm.ByteCounter; 0 for one process or a backend that does
	// not count).
	CommBytes int64 `json:"comm_bytes,omitempty"`
	// A mixture-of-experts model's step (moe.go; none for a dense model).
	AuxLoss       float64   `json:"aux_loss,omitempty"`
	ZLoss         float64   `json:"z_loss,omitempty"`
	ExpertLoad    [][]int64 `json:"expert_load,omitempty"`
	DroppedTokens int64     `json:"dropped_tokens,omitempty"`
	// ExpertRows is, under expert parallel, the token rows this rank's
	// forwards exchanged with the other ranks of its expert-parallel
	// group, by the routing: rows it sent to their experts plus rows it
	// received for its own (plugins/ep). The all-to-alls move each such
	// row four times a step (dispatch and combine, forward and backward).
	ExpertRows int64 `json:"expert_rows,omitempty"`
}

// Trainer holds one rank's training state.
type Trainer struct {
	Cfg   config.Config
	Model *nn.GPT
	Opt   optim.Optimizer
	Sched optim.Schedule
	Train *data.Loader
	Val   *data.Loader // nil when data.val_fraction is 0
	Alloc *tensor.Allocator

	// DataRank and DataSize place this rank in the data-parallel group:
	// it reads its slice of the global batch. Plugins set them in Prepare.
	DataRank, DataSize int
	// SeqParts is how many parts the rank's batch rows (B, T) are cut
	// into along the sequence in the residual stream between blocks: 1
	// unless a plugin splits the sequence inside the model (sequence
	// parallel multiplies it by tp; context parallel cuts the rows in the
	// data loader already, so it does not count here). A rank holds
	// (B, T/SeqParts, C), which is what a pipeline stage boundary
	// carries. Plugins set it in Prepare.
	SeqParts int

	Plugins []Plugin
	Rank    int
	World   int
	// Mesh is the rank's grid position and groups; nil for one process.
	Mesh *mesh.Mesh
	// Trace is the rank's span recorder; nil when tracing is off.
	Trace *trace.Recorder

	opts Options
	// savePeak and loadPeak are the most bytes a checkpoint save and load
	// added at once (the allocator's window peaks).
	savePeak, loadPeak int64
	metrics            *MetricsWriter
	metricsPath        string // metrics_file on rank 0 of a trainer New built
	gradErr            error
	stepStart          time.Time
	nonfinite          nonfiniteState
	scaler             *lossScaler // fp16 loss scaling; nil otherwise (precision.go)
	gradOverflow       bool        // some rank's gradients were non-finite (GradSumSquares)
	// ctx is Run's context; stopAgreed is set when every rank learned,
	// with the last gradient norm, that some rank was asked to stop.
	ctx        context.Context
	stopAgreed bool
	// optSet caches which parameters the optimizer of is updating.
	optSet struct {
		of     optim.Optimizer
		params map[*tensor.Tensor]bool
	}
	// keptReady are the parameters whose GradReady the step owner
	// dispatches itself (KeepGradReady).
	keptReady map[*tensor.Tensor]bool
	// baseDigest names a LoRA run's base (lora.go); "" until needed.
	baseDigest string
}

// New builds the model, optimizer and data of cfg and prepares the plugins.
func New(cfg config.Config, opts Options) (*Trainer, error) {
	t, err := start(cfg, opts)
	if err != nil {
		return nil, err
	}
	if t.Rank == 0 {
		if err := CheckOutputs(cfg); err != nil {
			return nil, err
		}
	}
	// Construction by placement (construct.go): describe, place, then
	// allocate and fill this rank's parts only.
	fill, done, err := initialFill(GPTConfig(cfg), Init{Seed: cfg.Train.Seed, From: cfg.InitFrom})
	if err != nil {
		return nil, err
	}
	defer done()
	if t.Model, err = nn.Describe(GPTConfig(cfg), DTypeOf(cfg), t.Alloc); err != nil {
		return nil, err
	}
	if err := t.loadData(); err != nil {
		return nil, err
	}
	if err := t.construct(fill, true); err != nil {
		return nil, err
	}
	// Run opens metrics_file once it knows the step it starts from.
	if t.Rank == 0 {
		t.metricsPath = cfg.MetricsFile
	}
	return t, nil
}

// NewWith assembles a trainer from a model, an optimizer and data streams
// the caller built (the C ABI keeps them as separate objects, so a script
// can inspect and load them before training) and prepares the plugins of
// opts exactly as New does. opts.Alloc should be the allocator the model
// was built from, so the memory report covers it. opt may be nil for a
// trainer that only runs forward passes, and train and val nil when the
// caller supplies every batch. The metrics file is left to the caller:
// New opens it for Run, which callers of NewWith do not use.
func NewWith(cfg config.Config, model *nn.GPT, opt optim.Optimizer, train, val *data.Loader, opts Options) (*Trainer, error) {
	if model == nil {
		return nil, errors.New("trainer: NewWith needs a model")
	}
	if opt == nil && len(opts.Plugins) > 0 {
		return nil, fmt.Errorf("trainer: plugin %s needs an optimizer to prepare; pass one (or no plugins for forward passes only)", opts.Plugins[0].Name())
	}
	if err := sameLoRA(cfg, model); err != nil {
		return nil, err
	}
	t, err := start(cfg, opts)
	if err != nil {
		return nil, err
	}
	t.Model, t.Opt, t.Train, t.Val = model, opt, train, val
	if err := t.wireMoE(); err != nil { // moe.go
		return nil, err
	}
	if err := t.prepare(); err != nil {
		return nil, err
	}
	return t, nil
}

// NewPlaced assembles a trainer around a model that is only described
// (nn.Describe: names and global shapes, no storage), as the C ABI keeps
// it until a session is prepared: the plugins of opts place it, then this
// rank allocates and fills only its own parts from init (the same rule as
// New: construct.go), and with withOpt builds the optimizer over them (or
// keeps the one a plugin built). Without withOpt there may be no plugins:
// the model is then whole on this rank, for forward passes or for reading
// its weights. train and val are as for NewWith.
func NewPlaced(cfg config.Config, model *nn.GPT, init Init, withOpt bool, train, val *data.Loader, opts Options) (*Trainer, error) {
	if model == nil {
		return nil, errors.New("trainer: NewPlaced needs a described model")
	}
	for _, p := range model.Params() {
		if p.HasStorage() {
			return nil, fmt.Errorf("trainer: NewPlaced needs a model without storage, but %s has some; use NewWith for a built model", p.Name)
		}
	}
	if err := sameLoRA(cfg, model); err != nil {
		return nil, err
	}
	if !withOpt && len(opts.Plugins) > 0 {
		return nil, fmt.Errorf("trainer: plugin %s places a model for training; build it with its optimizer (or no plugins for forward passes only)", opts.Plugins[0].Name())
	}
	t, err := start(cfg, opts)
	if err != nil {
		return nil, err
	}
	fill, done, err := initialFill(model.Config, init)
	if err != nil {
		return nil, err
	}
	defer done()
	t.Model, t.Train, t.Val = model, train, val
	if err := t.construct(fill, withOpt); err != nil {
		return nil, err
	}
	return t, nil
}

// sameLoRA refuses a model built by the caller whose adapters are not the
// ones the run's lora.* keys describe (a model made from the model.* keys
// alone has none), before anything is placed or trained.
func sameLoRA(cfg config.Config, model *nn.GPT) error {
	if want, got := GPTConfig(cfg).LoRA, model.Config.LoRA; !reflect.DeepEqual(want, got) {
		return fmt.Errorf("trainer: the run's lora.* keys (lora.rank=%d) are not the model's (%s): build the model from the run's config, as GPT(accelerator.config) does", cfg.LoRA.Rank, loraText(got))
	}
	return nil
}

// start validates cfg, fills in the defaults of opts and returns a trainer
// with everything but the model, optimizer and data.
func start(cfg config.Config, opts Options) (*Trainer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	if opts.World == 0 {
		opts.World = 1
	}
	if opts.Alloc == nil {
		// A fresh allocator per trainer: the memory report covers this
		// run only.
		opts.Alloc = tensor.NewAllocator()
	}
	if cfg.Train.Threads > 0 {
		cpu.SetThreads(cfg.Train.Threads)
	}
	opts.Alloc.SetCompute(computeDType(cfg)) // precision.go
	if m := opts.Mesh; m != nil && (m.WorldGroup().Size() != opts.World || m.Rank() != opts.Rank) {
		return nil, fmt.Errorf("trainer: the mesh is rank %d of %d but the options say rank %d of %d", m.Rank(), m.WorldGroup().Size(), opts.Rank, opts.World)
	}
	t := &Trainer{Cfg: cfg, Alloc: opts.Alloc, DataSize: 1, SeqParts: 1, Plugins: opts.Plugins,
		Rank: opts.Rank, World: opts.World, Mesh: opts.Mesh, Trace: opts.Trace, opts: opts,
		Sched: optim.Schedule{Kind: cfg.Train.Schedule, LR: cfg.Train.LR, MinLR: cfg.Train.MinLR,
			Warmup: cfg.Train.WarmupSteps, Steps: cfg.Train.Steps},
		scaler: newLossScaler(cfg)}
	if err := t.checkPlugins(); err != nil {
		return nil, err
	}
	return t, nil
}

// prepare runs the plugins' Prepare hooks, in order, then gives the
// blocks this rank holds their activation recomputation (recompute.*):
// after the plugins, which may have replaced the model by a stage. The
// buffers set-up released (a sharded strategy's unsharded copies) leave
// the allocator's free lists afterwards: nothing in training reuses their
// sizes, and kept there they would stay in the heap for the whole run.
func (t *Trainer) prepare() error {
	for _, p := range t.Plugins {
		if pr, ok := p.(Preparer); ok {
			if err := pr.Prepare(t); err != nil {
				return fmt.Errorf("trainer: prepare %s: %w", p.Name(), err)
			}
		}
	}
	t.Alloc.DropPool()
	t.Model.SetRecompute(RecomputeOf(t.Cfg), t.Cfg.Recompute.Blocks) // recompute.go
	return nil
}

func (t *Trainer) checkPlugins() error {
	var owners []string
	seen := map[string]bool{}
	for _, p := range t.Plugins {
		if seen[p.Name()] {
			return fmt.Errorf("trainer: plugin %q given twice", p.Name())
		}
		seen[p.Name()] = true
		if _, ok := p.(StepOwner); ok {
			owners = append(owners, p.Name())
		}
	}
	if len(owners) > 1 {
		return fmt.Errorf("trainer: plugins %v all want to own the step; at most one may (check the parallel config)", owners)
	}
	return nil
}

// BuildModel creates the GPT of cfg, fresh or from cfg.InitFrom.
func BuildModel(cfg config.Config, alloc *tensor.Allocator) (*nn.GPT, error) {
	m, err := nn.NewGPT(GPTConfig(cfg), cfg.Train.Seed, DTypeOf(cfg), alloc)
	if err != nil {
		return nil, err
	}
	if cfg.InitFrom != "" {
		if err := LoadWeights(m, cfg.InitFrom); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// SetModel replaces the model by m (a plugin's Prepare keeping only this
// rank's pipeline stage) and rebuilds the optimizer over its parameters.
// Parameters m shares with the old model by name and local shape take the
// old values, so weights loaded before (init_from) survive. Parameters m
// took over from the old model itself (the same tensors, e.g. the blocks a
// pipeline stage keeps with the layers a tensor-parallel plugin installed)
// are kept; the old model's other parameters are released.
func (t *Trainer) SetModel(m *nn.GPT) error {
	old := map[string]*tensor.Tensor{}
	for _, p := range t.Model.Params() {
		old[p.Name] = p
	}
	kept := map[*tensor.Tensor]bool{}
	for _, p := range m.Params() {
		kept[p] = true
		if q := old[p.Name]; q != nil && q != p && q.HasStorage() && slices.Equal(q.Shape(), p.Shape()) {
			p.CopyFrom(q)
		}
	}
	if t.Opt != nil {
		for _, s := range t.Opt.State() {
			s.Release()
		}
		t.Opt = BuildOptimizer(t.Cfg, m.Params(), t.Alloc)
	}
	for _, p := range t.Model.Params() {
		if kept[p] {
			continue
		}
		p.Release()
		if p.Grad != nil {
			p.Grad.Release()
		}
	}
	t.Model = m
	return nil
}

// GPTConfig extracts the model shape from a run config.
func GPTConfig(cfg config.Config) nn.GPTConfig {
	c := nn.GPTConfig{NLayer: cfg.Model.NLayer, NHead: cfg.Model.NHead, NEmbd: cfg.Model.NEmbd,
		BlockSize: cfg.Model.BlockSize, VocabSize: cfg.Model.VocabSize, MoE: moeConfig(cfg)}
	if cfg.Model.Arch == "llama" {
		c.Llama = &nn.LlamaShape{NKVHead: cfg.KVHeads(), Intermediate: cfg.FFNWidth(), RopeTheta: cfg.Model.RopeTheta,
			NormEps: cfg.Model.NormEps, Tied: cfg.Model.TieEmbeddings}
	}
	if l := cfg.LoRA; l.Rank > 0 {
		c.LoRA = &nn.LoRAShape{Rank: l.Rank, Alpha: l.Alpha, Targets: l.Targets, TrainBiases: l.TrainBiases == "all",
			Dropout: l.Dropout, Seed: cfg.Train.Seed}
	}
	return c
}

// BuildOptimizer creates the optimizer of cfg over those of params that
// take a gradient (weight decay for tensors of two or more dimensions):
// a frozen base weight (LoRA) has no optimizer state.
func BuildOptimizer(cfg config.Config, params []*tensor.Tensor, alloc *tensor.Allocator) optim.Optimizer {
	params = slices.DeleteFunc(slices.Clone(params), func(p *tensor.Tensor) bool { return !p.NeedsGrad() })
	return NewOptimizer(cfg, optim.DecayGroups(params, cfg.Train.WeightDecay), alloc)
}

// NewOptimizer creates the optimizer of cfg (train.optimizer and its
// hyper-parameters) over the given parameter groups.
func NewOptimizer(cfg config.Config, groups []optim.Group, alloc *tensor.Allocator) optim.Optimizer {
	if cfg.Train.Optimizer == "sgd" {
		return optim.NewSGD(cfg.Train.Momentum, groups, alloc)
	}
	return optim.NewAdamW(optim.AdamWConfig{Beta1: cfg.Train.Beta1, Beta2: cfg.Train.Beta2, Eps: cfg.Train.Eps}, groups, alloc)
}

func (t *Trainer) loadData() error {
	train, val := t.opts.Train, t.opts.Val
	if train == nil {
		shards, err := t.tokenShards()
		if err != nil {
			return err
		}
		if shards {
			return nil
		}
		c, err := data.Load(t.Cfg.Data.Path, t.Cfg.Data.Format, t.Cfg.Data.MaxBytes)
		if err != nil {
			return err
		}
		train, val = c.Split(t.Cfg.Data.ValFraction)
		if t.opts.Corpus == "" {
			t.opts.Corpus = c.Source
		}
	}
	var err error
	t.Train, err = data.NewLoader(train, t.Cfg.Model.BlockSize, t.Cfg.Data.Order, t.Cfg.Train.Seed)
	if err != nil {
		return fmt.Errorf("trainer: training split: %w", err)
	}
	if len(val) > 0 {
		t.Val, err = data.NewLoader(val, t.Cfg.Model.BlockSize, "sequential", t.Cfg.Train.Seed)
		if err != nil {
			return fmt.Errorf("trainer: validation split (raise data.val_fraction or set it to 0): %w", err)
		}
	}
	return nil
}

// tokenShards opens data.path as llm.c token shards when data.format says
// so (tokens, or auto and the first file has a shard header) and builds
// the loaders over them; it reports false for a text corpus. Validation
// reads data.val_path when set, else the last data.val_fraction of the
// token stream.
func (t *Trainer) tokenShards() (bool, error) {
	d := t.Cfg.Data
	if d.Path == "" || d.Format == "text" || d.Format == data.GoComments {
		return false, nil
	}
	if d.Format == "auto" {
		files, _ := filepath.Glob(d.Path)
		if len(files) == 0 {
			files = []string{d.Path}
		}
		slices.Sort(files)
		if !data.IsShardFile(files[0]) {
			return false, nil
		}
	}
	shards, err := data.OpenShards(d.Path)
	if err != nil {
		return true, err
	}
	var trainSegs, valSegs []data.Segment
	var valShards []*data.Shard
	if d.ValPath != "" {
		if valShards, err = data.OpenShards(d.ValPath); err != nil {
			return true, fmt.Errorf("data.val_path: %w", err)
		}
		trainSegs, _ = data.ShardSegments(shards, 0)
		valSegs, _ = data.ShardSegments(valShards, 0)
	} else {
		trainSegs, valSegs = data.ShardSegments(shards, d.ValFraction)
	}
	T, V := t.Cfg.Model.BlockSize, t.Cfg.Model.VocabSize
	for _, s := range append(append([]*data.Shard(nil), shards...), valShards...) {
		if err := s.CheckVocab(V); err != nil {
			return true, err
		}
	}
	if t.Train, err = data.NewSegmentLoader(trainSegs, T, d.Order, t.Cfg.Train.Seed, V); err != nil {
		return true, fmt.Errorf("trainer: training shards: %w", err)
	}
	if len(valSegs) > 0 {
		if t.Val, err = data.NewSegmentLoader(valSegs, T, "sequential", t.Cfg.Train.Seed, V); err != nil {
			return true, fmt.Errorf("trainer: validation shards (set data.val_path, raise data.val_fraction or set it to 0): %w", err)
		}
	}
	var total int64
	for _, s := range shards {
		total += s.Count
	}
	if t.opts.Corpus == "" {
		t.opts.Corpus = fmt.Sprintf("token shards %q (%d files, %d tokens, memory-mapped)", d.Path, len(shards), total)
	}
	return true, nil
}

// Params are the parameters this rank trains.
func (t *Trainer) Params() []*tensor.Tensor { return t.Model.Params() }

// Step runs optimizer step number step (0-based): every micro-batch's
// forward and backward, then clipping and the update.
func (t *Trainer) Step(step int) (StepMetrics, error) {
	t.stepStart = time.Now()
	_ = t.takeMoEMetrics(step, nil) // forwards between steps (evaluation) count in none; only resets
	bc, counting := t.world().(comm.ByteCounter)
	var sent int64
	if counting {
		sent = bc.RankSentBytes()
	}
	var loss float64
	var err error
	if owner := t.stepOwner(); owner != nil {
		loss, err = owner.RunStep(t, step)
	} else {
		loss, err = t.forwardBackward(step)
	}
	if err != nil {
		return StepMetrics{}, err
	}
	m, err := t.Update(step, loss)
	if err == nil {
		err = t.takeMoEMetrics(step, &m) // moe.go
	}
	if counting {
		m.CommBytes = bc.RankSentBytes() - sent
	}
	return m, err
}

// Update finishes optimizer step number step once every micro-batch's
// backward has run: it reduces the loss across ranks, runs the PreStep
// hooks, clips the global gradient norm, steps the optimizer, clears the
// gradients and runs the PostStep hooks. loss is this rank's mean loss over
// its micro-batches.
func (t *Trainer) Update(step int, loss float64) (StepMetrics, error) {
	loss, err := t.reduceLoss(loss, "loss")
	if err != nil {
		return StepMetrics{}, err
	}
	for _, p := range t.Plugins {
		if h, ok := p.(PreStepper); ok {
			if err := h.PreStep(t); err != nil {
				return StepMetrics{}, fmt.Errorf("trainer: %s pre-step: %w", p.Name(), err)
			}
		}
	}
	sumsq, err := t.GradSumSquares()
	if err != nil {
		return StepMetrics{}, err
	}
	// Under fp16 loss scaling an overflow skips the step and only the loss
	// goes to the non-finite guard (precision.go).
	norm, unscale := t.scaler.unscale(math.Sqrt(sumsq))
	overflow := t.scaler != nil && t.gradOverflow
	guarded := norm
	if overflow {
		guarded = 0
	}
	skip, err := t.checkFinite(loss, guarded) // nonfinite.go
	if err != nil {
		return StepMetrics{}, err
	}
	skip = skip || overflow
	t.scaler.update(overflow)
	lr := t.Sched.At(step)
	if !skip {
		// the unscaling and clipping factor, folded into the update where
		// the optimizer can (AdamW)
		span := t.Trace.Begin("optimizer", "compute", trace.Compute)
		err = optim.StepScaled(t.Opt, lr, unscale*optim.ClipCoef(norm, t.Cfg.Train.GradClip))
		span.End()
		if err != nil {
			return StepMetrics{}, err
		}
	}
	t.ZeroGrad()

	if t.stepStart.IsZero() {
		t.stepStart = time.Now()
	}
	elapsed := time.Since(t.stepStart)
	t.stepStart = time.Time{}
	tokens := float64(t.Cfg.Train.BatchSize*t.Cfg.Train.GradAccum*t.DataSize) * float64(t.Cfg.Model.BlockSize)
	m := StepMetrics{Step: step + 1, Loss: loss, LR: lr, GradNorm: norm,
		TokensPerS: tokens / elapsed.Seconds(), StepMS: float64(elapsed.Microseconds()) / 1000, Skipped: skip,
		LossScale: t.LossScale()}
	m.MFU = GPTConfig(t.Cfg).FLOPsPerToken() * m.TokensPerS / (t.Cfg.Train.PeakFLOPS * float64(t.World))
	for _, p := range t.Plugins {
		if h, ok := p.(PostStepper); ok {
			if err := h.PostStep(t, &m); err != nil {
				return StepMetrics{}, fmt.Errorf("trainer: %s post-step: %w", p.Name(), err)
			}
		}
	}
	// The masters changed (the step, and ZeRO's gathers in PostStep): the
	// next product makes fresh half-precision copies (precision.go).
	tensor.DropHalf(t.Params())
	return m, nil
}

func (t *Trainer) stepOwner() StepOwner {
	for _, p := range t.Plugins {
		if o, ok := p.(StepOwner); ok {
			return o
		}
	}
	return nil
}

// forwardBackward runs the micro-batches of a step and returns this rank's
// mean loss over them.
func (t *Trainer) forwardBackward(step int) (float64, error) {
	A := t.Cfg.Train.GradAccum
	B := t.Cfg.Train.BatchSize
	var sum float64
	for a := 0; a < A; a++ {
		info := t.TrainPass(step, a)
		x, y := t.Train.Batch(step, a, t.DataRank, t.DataSize, B, A)
		if err := t.Train.Err(); err != nil {
			return 0, err
		}
		loss, err := t.Forward(x, y, info)
		if err != nil {
			return 0, err
		}
		sum += loss.Scalar()
		// Each micro-batch contributes 1/A of the step's mean loss.
		if err := t.Backward(loss, 1/float64(A), info); err != nil {
			return 0, err
		}
	}
	return sum / float64(A), nil
}

// TrainPass is the PassInfo of micro-batch micro of training step step on
// this rank: its first sequence is sample (micro·N + r)·B of the step's
// global batch for data-parallel rank r of N, which is where
// data.Loader.Batch reads it from.
func (t *Trainer) TrainPass(step, micro int) tensor.PassInfo {
	A, B := t.Cfg.Train.GradAccum, t.Cfg.Train.BatchSize
	return tensor.PassInfo{Micro: micro, Last: micro == A-1, Train: true, Step: step,
		Sample0: (micro*t.DataSize + t.DataRank) * B}
}

// Forward runs the PreForward hooks and the model on one micro-batch
// (x, y int32 [B, T]) and returns its mean loss, ready for Backward.
func (t *Trainer) Forward(x, y *tensor.Tensor, info tensor.PassInfo) (*tensor.Tensor, error) {
	if t.stepStart.IsZero() {
		t.stepStart = time.Now()
	}
	if err := t.PreForward(info); err != nil {
		return nil, err
	}
	span := t.Trace.Begin("forward", "compute", trace.Compute).With("micro", info.Micro)
	loss, err := t.Model.Loss(x, y, nn.Pass{Info: info})
	span.End()
	if err != nil {
		return nil, fmt.Errorf("trainer: forward of micro-batch %d: %w", info.Micro, err)
	}
	return loss, nil
}

// PreForward runs the PreForward hooks; a step owner calls it before each
// micro-batch's forward as the trainer's own loop does.
func (t *Trainer) PreForward(info tensor.PassInfo) error {
	if t.stepStart.IsZero() {
		t.stepStart = time.Now()
	}
	for _, p := range t.Plugins {
		if h, ok := p.(PreForwarder); ok {
			if err := h.PreForward(t, info); err != nil {
				return fmt.Errorf("trainer: %s pre-forward: %w", p.Name(), err)
			}
		}
	}
	return nil
}

// Backward differentiates loss scaled by scale, dispatching GradReady to
// the plugins, releases the graph's buffers and runs the PostGrad hooks.
func (t *Trainer) Backward(loss *tensor.Tensor, scale float64, info tensor.PassInfo) error {
	g := t.Alloc.New(tensor.Activations, loss.DType(), loss.Shape()...)
	g.Set(0, t.LossSeed(scale))
	err := t.BackwardFrom(loss, g, info)
	g.Release()
	if err != nil {
		return err
	}
	loss.Release()
	return t.PostGrad(info)
}

// BackwardFrom runs backward from root with output gradient gradOut (a
// pipeline stage receiving dL/d(its output) from the next stage),
// dispatching GradReady to the plugins exactly as Backward does, so data
// parallel overlap works under any step owner, and releasing the graph's
// buffers (root and gradOut stay the caller's). It does not run the
// PostGrad hooks: a step owner calls PostGrad once a micro-batch's
// backward is complete on this rank.
func (t *Trainer) BackwardFrom(root, gradOut *tensor.Tensor, info tensor.PassInfo) error {
	_, err := t.backward(root, gradOut, info, false)
	return err
}

// BackwardSplit is BackwardFrom computing only the input gradients now:
// the weight gradients of linear layers are queued in the returned
// Deferred (zero-bubble pipeline schedules run them later, where a stage
// would otherwise wait). Run them with RunDeferred, which fires their
// GradReady; the graph's buffers are released then.
func (t *Trainer) BackwardSplit(root, gradOut *tensor.Tensor, info tensor.PassInfo) (*tensor.Deferred, error) {
	return t.backward(root, gradOut, info, true)
}

// RunDeferred computes the weight gradients BackwardSplit queued,
// dispatching GradReady for them.
func (t *Trainer) RunDeferred(d *tensor.Deferred, info tensor.PassInfo) error {
	t.gradErr = nil
	span := t.Trace.Begin("weight gradients", "compute", trace.Compute).With("micro", info.Micro)
	d.Run()
	span.End()
	return t.gradErr
}

// KeepGradReady stops backward from dispatching GradReady for p: a step
// owner that finishes p's gradient itself (a pipeline summing the tied
// embedding's gradient over the first and last stage) dispatches it with
// GradReady once the gradient is final.
func (t *Trainer) KeepGradReady(p *tensor.Tensor) {
	if t.keptReady == nil {
		t.keptReady = map[*tensor.Tensor]bool{}
	}
	t.keptReady[p] = true
}

// GradReady tells every GradReadier that p's gradient is final, as
// backward does (see KeepGradReady).
func (t *Trainer) GradReady(p *tensor.Tensor, info tensor.PassInfo) error {
	for _, pl := range t.Plugins {
		if r, ok := pl.(GradReadier); ok {
			if err := r.GradReady(t, p, info); err != nil {
				return fmt.Errorf("trainer: grad-ready for %s: %w", p.Name, err)
			}
		}
	}
	return nil
}

func (t *Trainer) backward(root, gradOut *tensor.Tensor, info tensor.PassInfo, split bool) (*tensor.Deferred, error) {
	var readiers []GradReadier
	for _, p := range t.Plugins {
		if r, ok := p.(GradReadier); ok {
			readiers = append(readiers, r)
		}
	}
	t.gradErr = nil
	opts := tensor.BackwardOptions{Info: info, Release: true, Alloc: t.Alloc, DeferWeightGrads: split}
	if len(readiers) > 0 {
		opts.GradReady = func(p *tensor.Tensor, info tensor.PassInfo) {
			if p.Spec == nil || t.keptReady[p] {
				return // not a parameter (a stage's received activation), or kept by the step owner
			}
			for _, r := range readiers {
				if err := r.GradReady(t, p, info); err != nil && t.gradErr == nil {
					t.gradErr = fmt.Errorf("trainer: grad-ready for %s: %w", p.Name, err)
				}
			}
		}
	}
	var needers []GradNeeder
	for _, p := range t.Plugins {
		if n, ok := p.(GradNeeder); ok {
			needers = append(needers, n)
		}
	}
	if len(needers) > 0 {
		opts.NeedGrad = func(p *tensor.Tensor, info tensor.PassInfo) {
			for _, n := range needers {
				if err := n.NeedGrad(t, p, info); err != nil && t.gradErr == nil {
					t.gradErr = fmt.Errorf("trainer: gradient buffer for %s: %w", p.Name, err)
				}
			}
		}
	}
	span := t.Trace.Begin("backward", "compute", trace.Compute).With("micro", info.Micro)
	d, err := tensor.Backward(root, gradOut, opts)
	span.End()
	if err != nil {
		return nil, err
	}
	return d, t.gradErr
}

// PostGrad runs the PostGrad hooks after a micro-batch's backward.
func (t *Trainer) PostGrad(info tensor.PassInfo) error {
	for _, p := range t.Plugins {
		if h, ok := p.(PostGrader); ok {
			if err := h.PostGrad(t, info); err != nil {
				return fmt.Errorf("trainer: %s post-grad: %w", p.Name(), err)
			}
		}
	}
	return nil
}

// ZeroGrad clears the gradients of the model and of the optimizer's
// parameters (buffers are kept for the next step).
func (t *Trainer) ZeroGrad() {
	for _, p := range t.Model.Params() {
		if p.Grad != nil {
			p.Grad.Zero()
		}
	}
	for _, p := range t.Opt.Params() {
		if p.Grad != nil {
			p.Grad.Zero()
		}
	}
}

// Evaluate returns the mean validation loss over cfg.Train.EvalBatches
// global evaluation batches, the same batches at every evaluation. Each
// has as many sequences as a training step's global batch and is cut the
// same way (data.Loader.EvalBatch): this rank's micro-batches go forward
// one at a time (through the step owner when there is one), and their mean
// is reduced across ranks by the LossReducers exactly as a training loss
// is. So every layout of the same global batch, one process included,
// reports the same value. Every rank calls it.
func (t *Trainer) Evaluate() (float64, error) {
	if t.Val == nil {
		return math.NaN(), errors.New("trainer: no validation split (data.val_fraction is 0)")
	}
	owner := t.stepOwner()
	n, A, B := t.Cfg.Train.EvalBatches, t.Cfg.Train.GradAccum, t.Cfg.Train.BatchSize
	var sum float64
	for k := 0; k < n; k++ {
		for a := 0; a < A; a++ {
			x, y := t.Val.EvalBatch(k, a, t.DataRank, t.DataSize, B, A)
			if err := t.Val.Err(); err != nil {
				return math.NaN(), err
			}
			v, err := t.evalLoss(owner, x, y)
			if err != nil {
				return math.NaN(), fmt.Errorf("trainer: evaluation batch %d, micro-batch %d: %w", k, a, err)
			}
			sum += v
		}
	}
	loss, err := t.reduceLoss(sum/float64(n*A), "evaluation loss")
	if err != nil {
		return math.NaN(), err
	}
	return loss, nil
}

// reduceLoss runs the LossReducers, in order, on this rank's mean loss
// over its part of a global batch; what names the loss in an error.
func (t *Trainer) reduceLoss(loss float64, what string) (float64, error) {
	for _, p := range t.Plugins {
		if r, ok := p.(LossReducer); ok {
			var err error
			if loss, err = r.ReduceLoss(t, loss); err != nil {
				return 0, fmt.Errorf("trainer: %s %s: %w", p.Name(), what, err)
			}
		}
	}
	return loss, nil
}

// evalLoss is the mean loss of one micro-batch, forward only.
func (t *Trainer) evalLoss(owner StepOwner, x, y *tensor.Tensor) (float64, error) {
	if owner != nil {
		return owner.EvalLoss(t, x, y)
	}
	loss, err := t.Model.Loss(x, y, nn.Pass{Info: tensor.PassInfo{Last: true}})
	if err != nil {
		return 0, err
	}
	v := loss.Scalar()
	tensor.FreeGraph(loss)
	loss.Release()
	return v, nil
}
