package main

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"time"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/data"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/optim"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// configObj is a resolved, validated run configuration.
type configObj struct {
	cfg config.Config
}

// modelObj is a GPT with the allocator that accounts its memory (and, once
// prepared, the activations and optimizer state of its session).
//
// tinyacc_model_new only describes the model (names and global shapes, no
// storage), so that tinyacc_prepare can construct it by placement as
// `tinyacc train` does (trainer.NewPlaced): under a launcher each rank
// allocates and fills only the parts its layout gives it, from init, and
// the optimizer state only for those. A call that needs the values before
// prepare (reading or setting a parameter, saving, generating) builds the
// whole model on this rank first, by the same rule (whole).
type modelObj struct {
	cfg   config.Config
	model *nn.GPT
	alloc *tensor.Allocator
	// init is where the parameters' values come from while the model is
	// only described: init_from, a file loaded since, or the seed.
	init  trainer.Init
	built bool // the parameters have storage (whole or placed)
	// sess is the last session the model was prepared in: saving a
	// data-parallel model goes through it.
	sess *session
}

// optimizerObj is an optimizer bound to one model's parameters. opt is nil
// until the model is built: prepare builds it over this rank's parts.
type optimizerObj struct {
	cfg   config.Config
	model *modelObj
	opt   optim.Optimizer
}

// loaderObj holds the training and validation streams of a corpus, cut
// into windows of the model's block size.
type loaderObj struct {
	cfg    config.Config
	train  *data.Loader
	val    *data.Loader // nil when data.val_fraction is 0
	source string
	// rank and size place the loader's batches in the data-parallel
	// group of the session it was prepared in (0 and 1 until then).
	rank, size int
}

// apiConfigNew resolves the defaults, a YAML or JSON document (blank text
// is none), then the TINYACC_* environment, as the command line layers a
// file under the environment (see apiConfigResolve).
func apiConfigNew(text string) (int64, error) {
	return apiConfigResolve("", text, "")
}

// apiConfigFromEnv resolves the layers the CLI reads, minus flags: the
// defaults, the YAML file (if file is not ""), then TINYACC_* environment
// variables. A program started by `tinyacc launch` or beside `tinyacc
// train` thus trains with the same configuration as the CLI.
func apiConfigFromEnv(file string) (int64, error) {
	r, err := config.Load(file, os.Environ(), nil)
	if err != nil {
		return 0, wrap(errConfig, err)
	}
	return register(&configObj{cfg: r.Config}), nil
}

// apiConfigJSON renders every key of a config as nested JSON, keyed like
// the YAML files, so bindings can read any value without a getter each.
func apiConfigJSON(h int64) (string, error) {
	c, err := get[configObj](h)
	if err != nil {
		return "", err
	}
	b, err := json.Marshal(sectionMap(reflect.ValueOf(c.cfg)))
	if err != nil {
		return "", wrap(errInternal, err)
	}
	return string(b), nil
}

// sectionMap turns a config struct into a map keyed by its koanf tags.
func sectionMap(v reflect.Value) map[string]any {
	out := map[string]any{}
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		name := t.Field(i).Tag.Get("koanf")
		if name == "" || name == "-" || !t.Field(i).IsExported() {
			continue
		}
		f := v.Field(i)
		switch {
		case f.Kind() == reflect.Struct:
			out[name] = sectionMap(f)
		case f.Type() == reflect.TypeOf(time.Duration(0)):
			out[name] = time.Duration(f.Int()).String()
		default:
			out[name] = f.Interface()
		}
	}
	return out
}

// applyThreads sets the compute threads the config asks for (0 keeps the
// default of all cores), as `tinyacc train` does.
func applyThreads(cfg config.Config) {
	if cfg.Train.Threads > 0 {
		cpu.SetThreads(cfg.Train.Threads)
	}
}

// apiModelNew builds the GPT of a config: model.* for the shape,
// train.seed for the initial weights, init_from to start from a file.
func apiModelNew(ch int64) (int64, error) {
	c, err := get[configObj](ch)
	if err != nil {
		return 0, err
	}
	applyThreads(c.cfg)
	gc := trainer.GPTConfig(c.cfg)
	if c.cfg.InitFrom != "" {
		if err := trainer.CheckWeights(c.cfg.InitFrom, gc, trainer.DTypeOf(c.cfg)); err != nil {
			return 0, wrap(errConfig, err)
		}
	}
	alloc := tensor.NewAllocator()
	m, err := nn.Describe(gc, trainer.DTypeOf(c.cfg), alloc)
	if err != nil {
		return 0, wrap(errConfig, err)
	}
	init := trainer.Init{Seed: c.cfg.Train.Seed, From: c.cfg.InitFrom}
	return register(&modelObj{cfg: c.cfg, model: m, alloc: alloc, init: init}), nil
}

// whole builds the whole model on this rank if it is still only
// described: every parameter allocated and filled from m.init, as a world
// of one constructs it.
func (m *modelObj) whole() error {
	if m.built {
		return nil
	}
	_, err := trainer.NewPlaced(m.cfg, m.model, m.init, false, nil, nil, trainer.Options{Alloc: m.alloc})
	m.built = hasStorage(m.model)
	return wrap(errRuntime, err)
}

// hasStorage reports whether any parameter of model has storage.
func hasStorage(model *nn.GPT) bool {
	for _, p := range model.Params() {
		if p.HasStorage() {
			return true
		}
	}
	return false
}

// apiOptimizerNew builds the optimizer a config selects (train.optimizer
// and its hyper-parameters) over a model's parameters.
func apiOptimizerNew(ch, mh int64) (int64, error) {
	c, err := get[configObj](ch)
	if err != nil {
		return 0, err
	}
	m, err := get[modelObj](mh)
	if err != nil {
		return 0, err
	}
	o := &optimizerObj{cfg: c.cfg, model: m}
	if m.built {
		o.opt = trainer.BuildOptimizer(c.cfg, m.model.Params(), m.alloc)
	}
	return register(o), nil
}

// optimizer is o's optimizer, built over the whole model now if neither
// prepare (which builds it over this rank's parts) nor an earlier call did.
func (o *optimizerObj) optimizer() (optim.Optimizer, error) {
	if o.opt == nil {
		if err := o.model.whole(); err != nil {
			return nil, err
		}
		o.opt = trainer.BuildOptimizer(o.cfg, o.model.model.Params(), o.model.alloc)
	}
	return o.opt, nil
}

// apiLoaderNew reads the corpus of a config (data.path, or the Go
// toolchain's sources when it is "") and splits it as the trainer does.
func apiLoaderNew(ch int64) (int64, error) {
	c, err := get[configObj](ch)
	if err != nil {
		return 0, err
	}
	cfg := c.cfg
	corpus, err := data.Load(cfg.Data.Path, cfg.Data.Format, cfg.Data.MaxBytes)
	if err != nil {
		return 0, wrap(errIO, err)
	}
	train, val := corpus.Split(cfg.Data.ValFraction)
	l := &loaderObj{cfg: cfg, source: corpus.Source, size: 1}
	T := cfg.Model.BlockSize
	if l.train, err = data.NewLoader(train, T, cfg.Data.Order, cfg.Train.Seed); err != nil {
		return 0, wrap(errConfig, fmt.Errorf("training split: %w", err))
	}
	if len(val) > 0 {
		if l.val, err = data.NewLoader(val, T, "sequential", cfg.Train.Seed); err != nil {
			return 0, wrap(errConfig, fmt.Errorf("validation split (raise data.val_fraction or set it to 0): %w", err))
		}
	}
	return register(l), nil
}

// loaderShape is the per-call batch a loader produces: B sequences of T
// tokens, A micro-batches per optimizer step.
func (l *loaderObj) shape() (B, T, A int) {
	return l.cfg.Train.BatchSize, l.cfg.Model.BlockSize, l.cfg.Train.GradAccum
}

// apiLoaderInfo reports batch size, block size, micro-batches per step and
// the number of training tokens.
func apiLoaderInfo(h int64) (B, T, A, tokens int, err error) {
	l, err := get[loaderObj](h)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	B, T, A = l.shape()
	return B, T, A, l.train.Len(), nil
}

// apiLoaderBatch fills x and y (B·T tokens each) with micro-batch micro of
// optimizer step step: exactly the batch `tinyacc train` uses at that step,
// on this rank once the loader is prepared in a data-parallel session.
func apiLoaderBatch(h int64, step, micro int, x, y []int32) error {
	l, err := get[loaderObj](h)
	if err != nil {
		return err
	}
	B, T, A := l.shape()
	if step < 0 || micro < 0 || micro >= A {
		return fail(errInvalidArg, "loader batch: step %d, micro-batch %d: need step >= 0 and 0 <= micro < train.grad_accum (%d)", step, micro, A)
	}
	if len(x) != B*T || len(y) != B*T {
		return fail(errSize, "loader batch: buffers hold %d and %d tokens but a batch is train.batch_size*model.block_size = %d*%d = %d", len(x), len(y), B, T, B*T)
	}
	xt, yt := l.train.Batch(step, micro, l.rank, l.size, B, A)
	copy(x, xt.I32())
	copy(y, yt.I32())
	return nil
}
