package plugins

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// layout is one way of running the same global batch of 8 sequences.
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
	{"tp2", 2, func(c *config.Config) { c.Parallel.TP = 2 }},
	{"tp2 sp", 2, func(c *config.Config) { c.Parallel.TP, c.TP.SequenceParallel = 2, true }},
	{"tp2 sp zero3 dp2", 4, func(c *config.Config) { c.Parallel.TP, c.TP.SequenceParallel, c.Zero.Stage = 2, true, 3 }},
}

const resumeGlobal = 8

func (l layout) config(steps int) config.Config {
	c := ptest.Config()
	c.Train.Steps = steps
	l.apply(&c)
	// Tensor-parallel ranks share their micro-batch: the data-parallel
	// ranks split the global batch.
	c.Train.BatchSize = resumeGlobal / (l.ranks / c.Parallel.TP)
	return c
}

func (l layout) run(t *testing.T, cfg config.Config, backend string) ptest.Result {
	if l.ranks == 1 {
		return ptest.Single(t, cfg)
	}
	rs := ptest.Parallel(t, cfg, l.ranks, backend, func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) { return Build(cfg, g) })
	return rs[0]
}

// TestResumeMatrix saves at step 3 of 6 under every layout and resumes
// under every other: steps 4-6 are those of the uninterrupted single
// process, and resuming under the layout that saved is bitwise.
func TestResumeMatrix(t *testing.T) {
	for _, backend := range []string{"local", "tcp"} {
		t.Run(backend, func(t *testing.T) {
			full := layouts[0].run(t, layouts[0].config(6), backend)
			want := full
			want.Losses, want.GradNorms = full.Losses[3:], full.GradNorms[3:]
			for _, saver := range layouts {
				dir := filepath.Join(t.TempDir(), "ckpt")
				cfg := saver.config(3)
				cfg.Checkpoint.Dir = dir
				saver.run(t, cfg, backend)
				var same ptest.Result
				for _, resumer := range layouts {
					if backend == "tcp" && resumer.name != saver.name && resumer.ranks == saver.ranks {
						continue // tcp: every change of rank count, and the same layout
					}
					cfg := resumer.config(6)
					cfg.Resume = dir
					got := resumer.run(t, cfg, backend)
					what := fmt.Sprintf("%s: saved by %s, resumed by %s", backend, saver.name, resumer.name)
					ptest.AssertEquivalent(t, want, got, what)
					if resumer.name == saver.name {
						same = got
					}
				}
				// The same layout continues bitwise: compare with its own
				// uninterrupted run.
				whole := saver.run(t, saver.config(6), backend)
				require.Equal(t, whole.Losses[3:], same.Losses, "%s: %s resumed by itself", backend, saver.name)
				require.Equal(t, whole.Params, same.Params, "%s: %s resumed by itself", backend, saver.name)
			}
		})
	}
}

// TestCheckpointMemoryIsBounded: under ZeRO-3 at dp 4, saving and loading
// a checkpoint add at most this rank's own shard plus the largest single
// tensor to what the rank holds (measured through the allocator).
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
	var largest int64
	for _, ps := range trainer.GPTConfig(cfg).ParamShapes() {
		largest = max(largest, 4*int64(len(saved[0].Params[ps.Name])))
	}
	for r := range saved {
		var shard int64
		for _, v := range saved[r].Local {
			shard += 4 * int64(len(v))
		}
		bound := shard + largest
		require.Positive(t, shard)
		require.LessOrEqual(t, saved[r].Memory.SavePeakBytes, bound, "rank %d: extra bytes while saving", r)
		require.Positive(t, loaded[r].Memory.LoadPeakBytes, "rank %d: loading reads its pieces through the allocator", r)
		require.LessOrEqual(t, loaded[r].Memory.LoadPeakBytes, bound, "rank %d: extra bytes while loading", r)
	}
}
