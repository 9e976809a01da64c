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
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/data"
	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
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
	Local map[string][]float64
	Specs map[string]*place.Spec
	// Initial is what this rank held of each parameter once trainer.New
	// returned, before any step, laid out as InitialSpecs says.
	Initial      map[string][]float64
	InitialSpecs map[string]*place.Spec
	Coord        place.Coord
	Memory       trainer.MemoryReport
	Trace        []trace.Event `json:"-"`
	// DType is train.dtype of the run: it picks the bounds (BoundsOf).
	DType string
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

// Config64 is the model of the float64 matrix (train.dtype float64): 4
// layers, 64 wide, 4 heads, large enough that float32 would sit at its
// noise floor against one process, with short sequences and few steps so
// a row of goroutine ranks stays fast. Kernels run on one thread: the
// goroutine ranks already share the cores, and several ranks' threaded
// kernels on small matrices mostly wait for each other (a float64 matrix
// costs about 2.4 times the CPU time with every core per kernel).
func Config64() config.Config {
	c := Config()
	c.Train.DType = "float64"
	c.Model.NLayer, c.Model.NHead, c.Model.NEmbd, c.Model.BlockSize = 4, 4, 64, 16
	c.Train.Steps, c.Train.BatchSize, c.Train.GradAccum = 3, 4, 1
	c.Train.Threads = 1
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
	return single(t, cfg)
}

// single is Single with plugins.
func single(t testing.TB, cfg config.Config, plugins ...trainer.Plugin) Result {
	defer cpu.SetThreads(cpu.Threads()) // train.threads is the process's; later runs get it back
	train, val := split(cfg)
	var steps []trainer.StepMetrics
	tr, err := trainer.New(cfg, trainer.Options{Train: train, Val: val, Plugins: plugins,
		OnStep: func(m trainer.StepMetrics) { steps = append(steps, m) }})
	require.NoError(t, err)
	initial, specs, err := held(tr)
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.NoError(t, err)
	r, err := collect(tr, steps, nil)
	require.NoError(t, err)
	r.Initial, r.InitialSpecs = initial, specs
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
	initial, specs, err := held(tr)
	if err != nil {
		return Result{}, fmt.Errorf("rank %d: %w", world.Rank(), err)
	}
	if _, err := tr.Run(context.Background()); err != nil {
		return Result{}, fmt.Errorf("rank %d: %w", world.Rank(), err)
	}
	r, err := collect(tr, steps, rec)
	r.Initial, r.InitialSpecs = initial, specs
	return r, err
}

// held copies what the rank holds of each parameter now, and says which
// part that is. It allocates nothing from the rank's allocator and
// communicates nothing, so it can run between construction and the first
// step without changing either.
func held(tr *trainer.Trainer) (map[string][]float64, map[string]*place.Spec, error) {
	values, specs := map[string][]float64{}, map[string]*place.Spec{}
	for _, p := range tr.Model.Params() {
		h, err := tr.Holding(p)
		if err != nil {
			return nil, nil, err
		}
		if h.Value.Data != nil {
			values[p.Name] = h.Value.Data.Float64s()
			specs[p.Name] = h.Value.Spec.Clone()
		}
	}
	return values, specs, nil
}

// Parallel trains cfg on n ranks of the given backend ("local" or "tcp",
// the latter over loopback inside this process), each with the plugins
// build returns for its world group, and returns every rank's result.
func Parallel(t testing.TB, cfg config.Config, n int, backend string, build Build) []Result {
	defer cpu.SetThreads(cpu.Threads()) // train.threads is the process's; later runs get it back
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
		Coord: tr.Coord(), Memory: tr.Memory(), Trace: rec.Events(), DType: tr.DType().String()}
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

// Bounds are how close a run must come to one process: the loss and the
// gradient norm of every step relative to one process's, and every global
// parameter relative norm-wise (‖got − want‖ / ‖want‖ per tensor).
type Bounds struct {
	Loss, Weights float64
	// Wider gives single tensors (by name suffix) a wider weight bound; a
	// row that needs one says why where it sets it.
	Wider map[string]float64
}

// Float32Bounds are the float32 rule: losses and gradient norms 1e-5,
// weights 1e-4. AdamW turns rounding noise on gradients that are zero in
// theory into full-size steps, so weights cannot be held element-wise, and
// 1e-4 is float32's noise floor: it holds on small models only.
var Float32Bounds = Bounds{Loss: 1e-5, Weights: 1e-4}

// Float64Bounds are the rule of train.dtype float64: 1e-9 on everything.
// Rounding noise is ~1e-16 there, below AdamW's eps, so a different
// summation order moves nothing measurably and any real difference in what
// a layout computes shows.
var Float64Bounds = Bounds{Loss: 1e-9, Weights: 1e-9}

// BoundsOf are the bounds of the dtype want was trained in.
func BoundsOf(want Result) Bounds {
	if want.DType == "float64" {
		return Float64Bounds
	}
	return Float32Bounds
}

// Worst is the largest difference of a run from one process: relative
// per step for the loss and the gradient norm, relative norm-wise for the
// weights, with the tensor where it was found.
type Worst struct {
	Loss, GradNorm, Weights float64
	Param                   string
}

// Add makes w the worst of w and o.
func (w *Worst) Add(o Worst) {
	w.Loss, w.GradNorm = max(w.Loss, o.Loss), max(w.GradNorm, o.GradNorm)
	if o.Weights >= w.Weights {
		w.Weights, w.Param = o.Weights, o.Param
	}
}

func (w Worst) String() string {
	return fmt.Sprintf("worst loss %.1e, gradient norm %.1e, weights %.1e (%s)", w.Loss, w.GradNorm, w.Weights, w.Param)
}

// rel is |got − want| / |want|.
func rel(got, want float64) float64 { return math.Abs(got-want) / math.Max(math.Abs(want), 1e-300) }

// AssertEquivalent holds a parallel rank's result to the single-process one
// within the bounds of want's dtype (BoundsOf) and returns how close it
// came. The gradient norm catches a gradient scaled wrongly, which AdamW
// and clipping would otherwise hide.
func AssertEquivalent(t testing.TB, want, got Result, what string) Worst {
	t.Helper()
	return AssertWithin(t, want, got, what, BoundsOf(want))
}

// AssertWithin is AssertEquivalent with explicit bounds.
func AssertWithin(t testing.TB, want, got Result, what string, b Bounds) Worst {
	t.Helper()
	require.NotEmpty(t, want.Losses, "%s: the reference ran no step", what)
	require.Len(t, got.Losses, len(want.Losses), what)
	require.Len(t, got.GradNorms, len(want.GradNorms), what)
	var w Worst
	for i := range want.Losses {
		w.Loss = max(w.Loss, rel(got.Losses[i], want.Losses[i]))
		w.GradNorm = max(w.GradNorm, rel(got.GradNorms[i], want.GradNorms[i]))
		require.LessOrEqual(t, rel(got.Losses[i], want.Losses[i]), b.Loss,
			"%s: loss of step %d is %v, one process %v", what, i, got.Losses[i], want.Losses[i])
		require.LessOrEqual(t, rel(got.GradNorms[i], want.GradNorms[i]), b.Loss,
			"%s: gradient norm of step %d is %v, one process %v", what, i, got.GradNorms[i], want.GradNorms[i])
	}
	pw := AssertParams(t, want.Params, got.Params, what, b)
	w.Weights, w.Param = pw.Weights, pw.Param
	return w
}

// AssertParams holds global parameters (a rank's gathered ones, or a
// saved file's) to one process's, norm-wise per tensor within b.Weights
// (or b.Wider for a tensor named there).
func AssertParams(t testing.TB, want, got map[string][]float64, what string, b Bounds) Worst {
	t.Helper()
	require.NotEmpty(t, want, "%s: the reference has no parameters", what)
	require.Len(t, got, len(want), "%s: parameters", what)
	var w Worst
	for _, name := range slices.Sorted(maps.Keys(want)) {
		g, ok := got[name]
		require.True(t, ok, "%s: no parameter %s", what, name)
		require.Len(t, g, len(want[name]), "%s: parameter %s", what, name)
		bound := b.Weights
		for suffix, wider := range b.Wider {
			if strings.HasSuffix(name, suffix) {
				bound = wider
			}
		}
		d := NormRel(g, want[name])
		require.LessOrEqual(t, d, bound, "%s: parameter %s", what, name)
		if d >= w.Weights {
			w.Weights, w.Param = d, name
		}
	}
	return w
}

// LoadParams reads a weights file (save_to, export) as global parameters.
func LoadParams(t testing.TB, path string) map[string][]float64 {
	t.Helper()
	ts, _, err := ckpt.Load(path)
	require.NoError(t, err)
	ps := map[string][]float64{}
	for name, x := range ts {
		ps[name] = x.Float64s()
	}
	return ps
}

// Check holds every rank of a parallel run to one process (AssertEquivalent)
// and its replicas to each other (AssertReplicas), and logs the worst
// difference over the ranks: `go test -v` prints the matrix's figures.
func Check(t testing.TB, want Result, got []Result, what string) Worst {
	t.Helper()
	return CheckWithin(t, want, got, what, BoundsOf(want))
}

// CheckWithin is Check with explicit bounds.
func CheckWithin(t testing.TB, want Result, got []Result, what string, b Bounds) Worst {
	t.Helper()
	var w Worst
	AssertInitial(t, want, got, what)
	for r := range got {
		w.Add(AssertWithin(t, want, got[r], fmt.Sprintf("%s, rank %d", what, r), b))
	}
	AssertReplicas(t, got, what)
	t.Logf("%s [%s]: %s", what, want.DType, w)
	return w
}

// AssertInitial holds the weights every rank of a layout starts from to
// one process's, bitwise: each element a rank holds once trainer.New
// returned is compared with the element of the same global index in
// want's, and the parts the ranks own (place.Spec.Owns) must cover every
// global element exactly once, so no element goes unchecked.
func AssertInitial(t testing.TB, want Result, got []Result, what string) {
	t.Helper()
	require.NotEmpty(t, want.Initial, "%s: the reference recorded no initial weights", what)
	owned := map[string]int{}
	for r, res := range got {
		for name, local := range res.Initial {
			global, ok := want.Initial[name]
			require.True(t, ok, "%s, rank %d: parameter %s is not one process's", what, r, name)
			spec := res.InitialSpecs[name]
			spec.Runs(res.Coord, func(g, l, n int) {
				for k := 0; k < n; k++ {
					if math.Float64bits(local[l+k]) != math.Float64bits(global[g+k]) {
						require.Failf(t, "initial weights differ", "%s, rank %d: %s element %d is %v at step 0, one process %v",
							what, r, name, g+k, local[l+k], global[g+k])
					}
				}
			})
			own, err := spec.Owns(res.Coord)
			require.NoError(t, err, "%s, rank %d: %s", what, r, name)
			if own {
				owned[name] += spec.HeldElements(res.Coord)
			}
		}
	}
	for name, global := range want.Initial {
		require.Equal(t, len(global), owned[name], "%s: the ranks own %d of the %d elements of %s at step 0", what, owned[name], len(global), name)
	}
}

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
