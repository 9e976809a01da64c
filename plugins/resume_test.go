package plugins

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// layout is one way of running the same global batch (resumeGlobal
// sequences).
type layout struct {
	name  string
	ranks int
	apply func(c *config.Config)
}

var layouts = []layout{
	{"1 process", 1, func(c *config.Config) {}},
	{"ddp dp2", 2, func(c *config.Config) {}},
	{"ddp dp4", 4, func(c *config.Config) {}},
	{"zero1 dp2", 2, func(c *config.Config) { c.Zero.Stage = 1 }},
	{"zero2 dp2", 2, func(c *config.Config) { c.Zero.Stage = 2 }},
	{"zero3 dp2", 2, func(c *config.Config) { c.Zero.Stage = 3 }},
	{"zero1 dp4", 4, func(c *config.Config) { c.Zero.Stage = 1 }},
	{"zero2 dp4", 4, func(c *config.Config) { c.Zero.Stage = 2 }},
	{"zero3 dp4", 4, func(c *config.Config) { c.Zero.Stage = 3 }},
	{"pp2", 2, func(c *config.Config) { c.Parallel.PP = 2 }},
	{"pp2 zb1 dp2 zero1", 4, func(c *config.Config) { c.Parallel.PP, c.PP.Schedule, c.Zero.Stage = 2, "zb1", 1 }},
	{"tp2", 2, func(c *config.Config) { c.Parallel.TP = 2 }},
	{"tp2 sp", 2, func(c *config.Config) { c.Parallel.TP, c.TP.SequenceParallel = 2, true }},
	{"tp2 sp zero3 dp2", 4, func(c *config.Config) { c.Parallel.TP, c.TP.SequenceParallel, c.Zero.Stage = 2, true, 3 }},
	{"cp2", 2, func(c *config.Config) { c.Parallel.CP = 2 }},
	{"cp2 tp2 sp", 4, func(c *config.Config) { c.Parallel.CP, c.Parallel.TP, c.TP.SequenceParallel = 2, 2, true }},
	{"pp2 interleaved", 2, func(c *config.Config) {
		c.Parallel.PP, c.PP.Schedule, c.PP.VirtualStages, c.Train.GradAccum = 2, "interleaved", 2, 2
	}},
	{"dp2 tp2 pp2 cp2 zero1", 16, func(c *config.Config) {
		c.Parallel.DP, c.Parallel.TP, c.Parallel.PP, c.Parallel.CP, c.Zero.Stage, c.Train.GradAccum = 2, 2, 2, 2, 1, 2
	}},
}

// composed are the layouts of the resume matrix that meet each other and
// one process, not every other layout, which keeps the matrix's cost
// down: context with tensor parallel, the interleaved pipeline, all four
// dimensions.
var composed = map[string]bool{"cp2 tp2 sp": true, "pp2 interleaved": true, "dp2 tp2 pp2 cp2 zero1": true}

// meets reports whether the resume matrix resumes a checkpoint of a under
// b: every pair of the other layouts, every pair of composed ones, and one
// process with all.
func (a layout) meets(b layout) bool {
	return composed[a.name] == composed[b.name] || a.ranks == 1 || b.ranks == 1
}

// resumeGlobal is the global batch of every layout: sequences per step.
const resumeGlobal = 8

// resumeSave and resumeSteps: every layout saves after resumeSave steps
// and resumes to resumeSteps.
const resumeSave, resumeSteps = 2, 4

// config is the run of l for steps steps on ptest's float32 model.
func (l layout) config(steps int) config.Config { return l.on(ptest.Config(), steps) }

// config64 is the run of l for steps steps on ptest's float64 model.
func (l layout) config64(steps int) config.Config { return l.on(ptest.Config64(), steps) }

func (l layout) on(c config.Config, steps int) config.Config {
	c.Train.Steps = steps
	l.apply(&c)
	// Tensor- and context-parallel ranks share their micro-batch and
	// pipeline stages run the same one: the data-parallel ranks split the
	// global batch, each into train.grad_accum micro-batches.
	c.Train.BatchSize = resumeGlobal / (l.ranks / (c.Parallel.PP * c.Parallel.TP * c.Parallel.CP)) / c.Train.GradAccum
	return c
}

func (l layout) run(t *testing.T, cfg config.Config, backend string) ptest.Result {
	if l.ranks == 1 {
		return ptest.Single(t, cfg)
	}
	rs := ptest.Parallel(t, cfg, l.ranks, backend, func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) { return Build(cfg, g) })
	return rs[0]
}

// TestResumeMatrix saves at step resumeSave of resumeSteps under every
// layout and resumes under every other it meets, in float64: the steps
// after the save are those of the uninterrupted single process (1e-9), and
// resuming under the layout that saved is bitwise. The tcp backend runs
// the single-dimension layouts.
func TestResumeMatrix(t *testing.T) {
	for _, backend := range []string{"local", "tcp"} {
		t.Run(backend, func(t *testing.T) {
			full := layouts[0].run(t, layouts[0].config64(resumeSteps), backend)
			want := full
			want.Losses, want.GradNorms = full.Losses[resumeSave:], full.GradNorms[resumeSave:]
			for _, saver := range layouts {
				if backend == "tcp" && composed[saver.name] {
					continue
				}
				dir := filepath.Join(t.TempDir(), "ckpt")
				cfg := saver.config64(resumeSave)
				cfg.Checkpoint.Dir = dir
				saver.run(t, cfg, backend)
				var same ptest.Result
				var worst ptest.Worst
				for _, resumer := range layouts {
					if !saver.meets(resumer) || backend == "tcp" && (composed[resumer.name] || resumer.name != saver.name && resumer.ranks == saver.ranks) {
						continue // tcp: every change of rank count, and the same layout
					}
					cfg := resumer.config64(resumeSteps)
					cfg.Resume = dir
					got := resumer.run(t, cfg, backend)
					what := fmt.Sprintf("%s: saved by %s, resumed by %s", backend, saver.name, resumer.name)
					worst.Add(ptest.AssertEquivalent(t, want, got, what))
					if resumer.name == saver.name {
						same = got
					}
				}
				t.Logf("%s: saved by %s, resumed by every layout it meets [%s]: %s", backend, saver.name, want.DType, worst)
				// The same layout continues bitwise: compare with its own
				// uninterrupted run.
				whole := saver.run(t, saver.config64(resumeSteps), backend)
				require.Equal(t, whole.Losses[resumeSave:], same.Losses, "%s: %s resumed by itself", backend, saver.name)
				require.Equal(t, whole.Params, same.Params, "%s: %s resumed by itself", backend, saver.name)
			}
		})
	}
}

// TestCheckpointMemoryIsBounded: under ZeRO-3 at dp 4, saving a
// checkpoint adds at most this rank's own shard plus the largest single
// tensor to what the rank holds, and loading one adds no more than rank
// 0's check buffer (measured through the allocator).
func TestCheckpointMemoryIsBounded(t *testing.T) {
	z3 := layouts[8]
	dir := filepath.Join(t.TempDir(), "ckpt")
	cfg := z3.config(2)
	cfg.Checkpoint.Dir = dir
	build := func(cfg config.Config) ptest.Build {
		return func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) { return Build(cfg, g) }
	}
	saved := ptest.Parallel(t, cfg, z3.ranks, "local", build(cfg))
	cfg = z3.config(3)
	cfg.Resume = dir
	loaded := ptest.Parallel(t, cfg, z3.ranks, "local", build(cfg))
	es := int64(trainer.DTypeOf(cfg).Size())
	var largest int64
	for _, ps := range trainer.GPTConfig(cfg).ParamShapes() {
		largest = max(largest, es*int64(len(saved[0].Params[ps.Name])))
	}
	for r := range saved {
		var shard int64
		for _, v := range saved[r].Local {
			shard += es * int64(len(v))
		}
		bound := shard + largest
		require.Positive(t, shard)
		require.LessOrEqual(t, saved[r].Memory.SavePeakBytes, bound, "rank %d: extra bytes while saving", r)
		// Loading reads each piece's byte ranges straight into the rank's
		// parts; only rank 0's checks borrow a buffer (of 4096 elements).
		require.LessOrEqual(t, loaded[r].Memory.LoadPeakBytes, min(bound, 4096*es), "rank %d: extra bytes while loading", r)
	}
}

// TestExportEqualsSaveTo: exporting a ZeRO-3 dp 4 checkpoint gives, byte
// for byte, the save_to file the same run wrote at the same step; loading
// the exported file with init_from and evaluating gives the run's own
// evaluation loss.
func TestExportEqualsSaveTo(t *testing.T) {
	z3 := layouts[8]
	dir := t.TempDir()
	cfg := z3.config(3)
	cfg.Checkpoint.Dir = filepath.Join(dir, "ckpt")
	cfg.SaveTo = filepath.Join(dir, "save_to.safetensors")
	cfg.Data.ValFraction, cfg.Train.EvalBatches = 0.2, 2
	var evals [4]float64
	ptest.Parallel(t, cfg, z3.ranks, "local", func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) {
		ps, m, err := Build(cfg, g)
		// Evaluation after the last step is the run's own loss.
		return append(ps, evalProbe{&evals[g.Rank()]}), m, err
	})
	exported := filepath.Join(dir, "exported.safetensors")
	require.NoError(t, trainer.ExportCheckpoint(filepath.Join(cfg.Checkpoint.Dir, ckpt.StepDir(3)), exported))
	a, err := os.ReadFile(cfg.SaveTo)
	require.NoError(t, err)
	b, err := os.ReadFile(exported)
	require.NoError(t, err)
	require.True(t, bytes.Equal(a, b), "the exported file differs from save_to")

	one := layouts[0].config(3)
	one.InitFrom = exported // the same global evaluation batch as the run's
	one.Data.ValFraction, one.Train.EvalBatches = cfg.Data.ValFraction, cfg.Train.EvalBatches
	c := ptest.Corpus()
	cut := len(c) - int(float64(len(c))*one.Data.ValFraction)
	tr, err := trainer.New(one, trainer.Options{Train: c[:cut], Val: c[cut:]})
	require.NoError(t, err)
	got, err := tr.Evaluate()
	require.NoError(t, err)
	for r, want := range evals {
		require.InEpsilon(t, want, got, 1e-6, "rank %d's evaluation", r)
	}
}

// evalProbe evaluates once training is done, as Finish runs after the
// last step and save.
type evalProbe struct{ loss *float64 }

func (evalProbe) Name() string { return "eval-probe" }
func (p evalProbe) Finish(t *trainer.Trainer) error {
	v, err := t.Evaluate()
	*p.loss = v
	return err
}
