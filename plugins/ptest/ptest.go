// Package ptest is the equivalence harness of the parallel plugins: it runs
// the same training once in a single process and once on N ranks laid out
// on a mesh, and holds the parallel run to the single one (the rule
// "equivalence is the law"). Ranks run as goroutines in this process
// (Parallel) or as real processes (Processes: the test binary runs itself
// once per rank).
package ptest

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/data"
	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/trace"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// Result is what one rank of a run ends with.
type Result struct {
	Losses    []float64
	GradNorms []float64 // global gradient norm of each step, before clipping
	// CommBytes is the payload this rank sent in each step, on every group.
	CommBytes []int64
	// Params are the global parameters after the last step, by name, each
	// gathered through its placement (Trainer.GatherParam).
	Params map[string][]float64
	// Local is what this rank holds of each parameter it holds, and Specs
	// says which part that is.
	Local  map[string][]float64
	Specs  map[string]*place.Spec
	Coord  place.Coord
	Memory trainer.MemoryReport
	Trace  []trace.Event `json:"-"`
}

// Build makes the plugins and the mesh of one rank of a world group, as
// plugins.Build does from a config.
type Build func(world comm.Group) ([]trainer.Plugin, *mesh.Mesh, error)

// DP adapts a constructor of data-parallel plugins to Build: the world is
// one data-parallel group.
func DP(f func(dp comm.Group) ([]trainer.Plugin, error)) Build {
	return func(world comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) {
		m, err := mesh.New(world, 1, 1, world.Size(), 1)
		if err != nil {
			return nil, nil, err
		}
		ps, err := f(m.DP())
		return ps, m, err
	}
}

// Config is a small GPT that trains in well under a second per step.
func Config() config.Config {
	c := config.Defaults()
	c.Model.NLayer, c.Model.NHead, c.Model.NEmbd, c.Model.BlockSize = 2, 2, 32, 16
	c.Train.Steps, c.Train.BatchSize, c.Train.GradAccum = 10, 4, 1
	c.Train.LR, c.Train.WarmupSteps = 3e-3, 2
	c.Train.EvalEvery = 0
	c.Data.ValFraction = 0
	return c
}

// Corpus is the token stream every run reads.
func Corpus() []int32 {
	return data.Encode(strings.Repeat("func main() { fmt.Println(\"hello, tinyacc\") }\n// a comment\n", 80))
}

// split cuts Corpus into the training and validation streams of cfg
// (the last data.val_fraction is held out, as for a corpus read from disk).
func split(cfg config.Config) (train, val []int32) {
	c := Corpus()
	cut := len(c) - int(math.Floor(float64(len(c))*cfg.Data.ValFraction))
	return c[:cut:cut], c[cut:]
}

// Single trains cfg in one process; cfg.Train.BatchSize must be the global
// micro-batch (per-rank batch × data-parallel ranks).
func Single(t testing.TB, cfg config.Config) Result {
	train, val := split(cfg)
	var steps []trainer.StepMetrics
	tr, err := trainer.New(cfg, trainer.Options{Train: train, Val: val, OnStep: func(m trainer.StepMetrics) { steps = append(steps, m) }})
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.NoError(t, err)
	r, err := collect(tr, steps, nil)
	require.NoError(t, err)
	return r
}

// runRank trains one rank of world and collects its result.
func runRank(cfg config.Config, world comm.Group, build Build, rec *trace.Recorder) (Result, error) {
	plugins, m, err := build(world)
	if err != nil {
		return Result{}, err
	}
	train, val := split(cfg)
	var steps []trainer.StepMetrics
	tr, err := trainer.New(cfg, trainer.Options{Train: train, Val: val, Plugins: plugins, Mesh: m,
		Rank: world.Rank(), World: world.Size(), Trace: rec, OnStep: func(m trainer.StepMetrics) { steps = append(steps, m) }})
	if err != nil {
		return Result{}, fmt.Errorf("rank %d: %w", world.Rank(), err)
	}
	if _, err := tr.Run(context.Background()); err != nil {
		return Result{}, fmt.Errorf("rank %d: %w", world.Rank(), err)
	}
	return collect(tr, steps, rec)
}

// Parallel trains cfg on n ranks of the given backend ("local" or "tcp",
// the latter over loopback inside this process), each with the plugins
// build returns for its world group, and returns every rank's result.
func Parallel(t testing.TB, cfg config.Config, n int, backend string, build Build) []Result {
	results := make([]Result, n)
	var mu sync.Mutex
	run := func(g comm.Group) error {
		rec := trace.New(g.Rank())
		r, err := runRank(cfg, g, build, rec)
		if err != nil {
			return err
		}
		mu.Lock()
		results[g.Rank()] = r
		mu.Unlock()
		return nil
	}
	opts := comm.Options{Timeout: timeout}
	var err error
	switch backend {
	case "local":
		err = comm.RunLocal(n, opts, run)
	case "tcp":
		err = comm.RunTCPLocal(n, opts, run)
	default:
		t.Fatalf("ptest: unknown backend %q", backend)
	}
	require.NoError(t, err)
	return results
}

// collect gathers a finished rank's result. Gathering the global
// parameters is collective: every rank of the run calls it.
func collect(tr *trainer.Trainer, steps []trainer.StepMetrics, rec *trace.Recorder) (Result, error) {
	r := Result{Params: map[string][]float64{}, Local: map[string][]float64{}, Specs: map[string]*place.Spec{},
		Coord: tr.Coord(), Memory: tr.Memory(), Trace: rec.Events()}
	for _, s := range steps {
		r.Losses = append(r.Losses, s.Loss)
		r.GradNorms = append(r.GradNorms, s.GradNorm)
		r.CommBytes = append(r.CommBytes, s.CommBytes)
	}
	for _, p := range tr.Model.Params() {
		h, err := tr.Holding(p)
		if err != nil {
			return r, err
		}
		if h.Value.Data != nil {
			r.Local[p.Name] = h.Value.Data.Float64s()
			r.Specs[p.Name] = h.Value.Spec.Clone()
		}
	}
	for _, ps := range tr.Model.Config.ParamShapes() {
		g, err := tr.GatherParam(ps, -1)
		if err != nil {
			return r, err
		}
		r.Params[ps.Name] = g.Float64s()
		g.Release()
	}
	return r, nil
}

// NormRel is ‖got − want‖ / ‖want‖.
func NormRel(got, want []float64) float64 {
	var d, w float64
	for i := range want {
		d += (got[i] - want[i]) * (got[i] - want[i])
		w += want[i] * want[i]
	}
	return math.Sqrt(d) / math.Max(math.Sqrt(w), 1e-30)
}

// AssertEquivalent holds a parallel rank's result to the single-process
// one: losses and gradient norms within 1e-5 relative (the norm catches a
// gradient scaled wrongly, which AdamW and clipping would otherwise hide),
// every global parameter within 1e-4 norm-wise (AdamW turns float noise on
// gradients that are zero in theory into full-size steps, so element-wise
// 1e-5 is not attainable), with one exception explained at KeyBiasTol.
func AssertEquivalent(t testing.TB, want, got Result, what string) {
	t.Helper()
	require.Len(t, got.Losses, len(want.Losses), what)
	for i := range want.Losses {
		require.InEpsilon(t, want.Losses[i], got.Losses[i], 1e-5, "%s: loss of step %d", what, i)
		require.InEpsilon(t, want.GradNorms[i], got.GradNorms[i], 1e-5, "%s: gradient norm of step %d", what, i)
	}
	require.Len(t, got.Params, len(want.Params), "%s: parameters", what)
	for name, w := range want.Params {
		g, ok := got.Params[name]
		require.True(t, ok, "%s: no parameter %s", what, name)
		require.Len(t, g, len(w), "%s: parameter %s", what, name)
		if !strings.HasSuffix(name, ".attn.c_attn.bias") {
			require.LessOrEqual(t, NormRel(g, w), 1e-4, "%s: parameter %s", what, name)
			continue
		}
		// [query | key | value], C each: query and value under the rule,
		// the key part under KeyBiasTol of the whole tensor's norm.
		C := len(w) / 3
		qv := func(v []float64) []float64 { return append(append([]float64(nil), v[:C]...), v[2*C:]...) }
		require.LessOrEqual(t, NormRel(qv(g), qv(w)), 1e-4, "%s: query and value parts of %s", what, name)
		var d, n float64
		for i := C; i < 2*C; i++ {
			d += (g[i] - w[i]) * (g[i] - w[i])
		}
		for _, v := range w {
			n += v * v
		}
		require.LessOrEqual(t, math.Sqrt(d)/math.Max(math.Sqrt(n), 1e-30), KeyBiasTol, "%s: key part of %s", what, name)
	}
}

// KeyBiasTol bounds the difference of the attention key biases, relative
// to the norm of the whole c_attn bias.
//
// The key bias has a gradient of exactly zero in theory (adding q·b_k to
// every score of a softmax row changes nothing), so what it receives is
// rounding noise, which AdamW normalises into real steps; any change of
// summation order (data-parallel averaging, or one process splitting its
// batch into micro-batches) moves it by up to 100% of its own tiny value.
// That puts the whole c_attn bias at ~1e-4 against the single process, on
// the edge of the 1e-4 rule, while the query and value parts agree to
// ~1e-6. So those are held to the rule and the key part to this bound, still
// far below the size of a real update.
const KeyBiasTol = 1e-3

// AssertReplicas checks that replicas are bitwise identical inside their
// replication groups: two ranks that differ only along axes on which a
// parameter is replicated hold the same part of it, so it must hold the
// same numbers. Ranks that hold different parts (shards, stages) are not
// compared.
func AssertReplicas(t testing.TB, rs []Result, what string) {
	t.Helper()
	for a := range rs {
		for b := a + 1; b < len(rs); b++ {
			for name, va := range rs[a].Local {
				sa := rs[a].Specs[name]
				vb, ok := rs[b].Local[name]
				if !ok || !replicas(sa, rs[b].Specs[name], rs[a].Coord, rs[b].Coord) {
					continue
				}
				require.Equal(t, va, vb, "%s: ranks %d and %d hold the same replica of %s but differ", what, a, b, name)
			}
		}
	}
}

// replicas reports whether two ranks hold the same part of a parameter:
// equal placements, and their coordinates differ only along axes where the
// parameter is replicated.
func replicas(sa, sb *place.Spec, ca, cb place.Coord) bool {
	if sa == nil || sb == nil || sa.String() != sb.String() || !slices.Equal(sa.Shape, sb.Shape) {
		return false
	}
	for ax := place.Axis(0); ax < place.NumAxes; ax++ {
		if ca.Rank[ax] != cb.Rank[ax] && sa.Along[ax].Kind != place.Replicate {
			return false
		}
	}
	return true
}

// timeout is generous for a loaded 2-core machine and still no hang.
const timeout = 60 * time.Second
