package plugins

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ptest"
	"github.com/tinyacc/tinyacc/plugins/tp"
	"github.com/tinyacc/tinyacc/plugins/zero"
)

// tpConfig is ptest's float64 model (4 heads, for 4 tensor-parallel
// ranks) with a vocabulary (257) that divides by neither 2 nor 4,
// per-rank micro-batch 2.
func tpConfig(tpn int, sp bool, accum int) config.Config {
	c := ptest.Config64()
	c.Model.VocabSize = 257
	c.Train.Steps, c.Train.BatchSize, c.Train.GradAccum = 3, 2, accum
	c.Parallel.TP, c.TP.SequenceParallel = tpn, sp
	return c
}

// tpData is how the data-parallel dimension composes with tensor
// parallel in the matrix.
// The last two (naive DDP, ZeRO-2) run at tp 2 with accumulation only.
var tpData = []struct {
	name  string
	dp    int
	apply func(c *config.Config)
	extra bool
}{
	{"alone", 1, func(c *config.Config) {}, false},
	{"dp2 ddp bucketed", 2, func(c *config.Config) { c.DDP.Mode, c.DDP.BucketMB, c.DDP.FirstBucketMB = "bucketed", 0.02, 0.01 }, false},
	{"dp2 zero1", 2, func(c *config.Config) { c.Zero.Stage = 1 }, false},
	{"dp2 zero3", 2, func(c *config.Config) { c.Zero.Stage = 3 }, false},
	{"dp2 ddp naive", 2, func(c *config.Config) { c.DDP.Mode = "naive" }, true},
	{"dp2 zero2", 2, func(c *config.Config) { c.Zero.Stage = 2 }, true},
}

// tpSingles caches the single-process runs by (dp, accum).
var tpSingles = struct {
	sync.Mutex
	m map[[2]int]ptest.Result
}{m: map[[2]int]ptest.Result{}}

func tpSingle(t *testing.T, dp, accum int) ptest.Result {
	tpSingles.Lock()
	defer tpSingles.Unlock()
	k := [2]int{dp, accum}
	if r, ok := tpSingles.m[k]; ok {
		return r
	}
	cfg := tpConfig(1, false, accum)
	cfg.Train.BatchSize *= dp
	r := ptest.Single(t, cfg)
	tpSingles.m[k] = r
	return r
}

func buildFrom(cfg config.Config) ptest.Build {
	return func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) { return Build(cfg, g) }
}

// TestTensorParallelMatrix holds tensor parallel to one process on the
// same global batch: tp 2 and 4, with and without sequence parallelism,
// alone and under dp 2 with bucketed DDP, ZeRO-1 and ZeRO-3, with and
// without gradient accumulation, with a vocabulary that does not divide
// by tp (and, at tp 2, naive DDP and ZeRO-2). The whole matrix runs on
// goroutine ranks; the tcp backend runs a part of it (every composition at
// tp 2, with accumulation).
func TestTensorParallelMatrix(t *testing.T) {
	for _, backend := range []string{"local", "tcp"} {
		for _, tpn := range []int{2, 4} {
			for _, sp := range []bool{false, true} {
				for _, d := range tpData {
					for _, accum := range []int{1, 2} {
						if (backend == "tcp" || d.extra) && (tpn != 2 || accum != 2) {
							continue
						}
						name := fmt.Sprintf("%s/tp%d/sp=%v/%s/accum%d", backend, tpn, sp, d.name, accum)
						t.Run(name, func(t *testing.T) {
							cfg := tpConfig(tpn, sp, accum)
							d.apply(&cfg)
							want := tpSingle(t, d.dp, accum)
							got := ptest.Parallel(t, cfg, tpn*d.dp, backend, buildFrom(cfg))
							ptest.Check(t, want, got, name)
						})
					}
				}
			}
		}
	}
}

// TestTensorParallelProcesses runs tensor-parallel layouts as real
// processes over tcp, built from the config as `tinyacc train --nproc`
// builds them.
func TestTensorParallelProcesses(t *testing.T) {
	for _, c := range []struct {
		id    string
		sp    bool
		stage int
	}{{"tp2", false, 0}, {"tp2-sp-zero3", true, 3}} {
		cfg := tpConfig(2, c.sp, 1)
		dp := 1
		if c.stage > 0 {
			cfg.Zero.Stage, dp = c.stage, 2
		}
		got := ptest.Processes(t, c.id, cfg, 2*dp, buildFrom(cfg))
		if got == nil {
			continue // this process is a rank of another layout's run
		}
		single := tpConfig(1, false, 1)
		single.Train.BatchSize = cfg.Train.BatchSize * dp
		want := ptest.Single(t, single)
		ptest.Check(t, want, got, c.id+", processes")
	}
}

// gradProbe records, on the first step, the gradient this rank holds of
// every parameter (reduced: it runs after data parallel's PreStep).
type gradProbe struct {
	grads map[string][]float64
	specs map[string]*place.Spec
	coord place.Coord
}

func (g *gradProbe) Name() string { return "grad probe" }

func (g *gradProbe) PreStep(t *trainer.Trainer) error {
	if g.grads != nil {
		return nil
	}
	g.grads, g.specs, g.coord = map[string][]float64{}, map[string]*place.Spec{}, t.Coord()
	for _, p := range t.Model.Params() {
		h, err := t.Holding(p)
		if err != nil {
			return err
		}
		if h.Grad.Data != nil {
			g.grads[p.Name] = h.Grad.Data.Float64s()
			g.specs[p.Name] = h.Grad.Spec.Clone()
		}
	}
	return nil
}

// The parameters every rank of a TP group holds whole (LayerNorms, the
// row-parallel biases, wpe) get the same gradient on every rank of the
// group, bit for bit, by construction: under plain TP from replicated
// activations, under sequence parallelism from the sum over the group.
func TestReplicatedGradientsAgreeAcrossTheGroup(t *testing.T) {
	for _, sp := range []bool{false, true} {
		for _, d := range tpData {
			name := fmt.Sprintf("sp=%v/%s", sp, d.name)
			t.Run(name, func(t *testing.T) {
				cfg := tpConfig(2, sp, 2)
				cfg.Train.Steps = 1
				d.apply(&cfg)
				probes := make([]*gradProbe, 2*d.dp)
				var mu sync.Mutex
				ptest.Parallel(t, cfg, 2*d.dp, "local", func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) {
					ps, m, err := Build(cfg, g)
					p := &gradProbe{}
					mu.Lock()
					probes[g.Rank()] = p
					mu.Unlock()
					return append(ps, p), m, err
				})
				compared := 0
				for a := range probes {
					for b := range probes {
						ca, cb := probes[a].coord, probes[b].coord
						if a >= b || ca.Rank[place.TP] == cb.Rank[place.TP] || ca.Rank[place.DP] != cb.Rank[place.DP] {
							continue // pairs of one TP group
						}
						for pname, ga := range probes[a].grads {
							s := probes[a].specs[pname]
							if s.Along[place.TP].Kind != place.Replicate {
								continue
							}
							require.Equal(t, ga, probes[b].grads[pname], "%s: ranks %d and %d: gradient of %s", name, a, b, pname)
							compared++
						}
					}
				}
				require.Positive(t, compared)
			})
		}
	}
}

// Under sequence parallelism every rank keeps 1/tp of the LayerNorm
// regions' activations: the allocator's activation peak per rank is below
// plain tensor parallel's on the same layout, and both are below one
// process's. Parameters, gradients and optimizer state per rank are the
// rank's part of the model.
func TestTensorParallelMemory(t *testing.T) {
	run := func(tpn int, sp bool) []ptest.Result {
		cfg := tpConfig(tpn, sp, 1)
		cfg.Model.NEmbd, cfg.Model.BlockSize, cfg.Train.Steps = 128, 32, 2
		cfg.Train.DType = "float32" // 4 bytes an element below
		if tpn == 1 {
			return []ptest.Result{ptest.Single(t, cfg)}
		}
		return ptest.Parallel(t, cfg, tpn, "local", buildFrom(cfg))
	}
	one, plain, seq := run(1, false), run(2, false), run(2, true)
	for r := range plain {
		p, s := plain[r].Memory, seq[r].Memory
		t.Logf("rank %d activation peak: one process %d, tp %d, tp+sp %d bytes", r, one[0].Memory.ActPeak, p.ActPeak, s.ActPeak)
		require.Less(t, s.ActPeak, p.ActPeak, "rank %d: sequence parallel's activation peak", r)
		require.Less(t, p.ActPeak, one[0].Memory.ActPeak, "rank %d: tensor parallel's activation peak", r)
		var local int64
		for _, v := range plain[r].Local {
			local += 4 * int64(len(v))
		}
		require.Equal(t, local, p.ParamsBytes, "rank %d: parameter bytes are its part", r)
		require.Equal(t, local, p.GradsBytes, "rank %d: gradient bytes", r)
		require.Equal(t, 2*local, p.OptimBytes, "rank %d: AdamW's two moments", r)
		require.Less(t, local, one[0].Memory.ParamsBytes, "rank %d holds less than the model", r)
	}
}

// The TP plugin comes first, before data parallel, and keeps its group.
func TestBuildPutsTensorParallelFirst(t *testing.T) {
	require.NoError(t, comm.RunLocal(4, comm.Options{}, func(g comm.Group) error {
		cfg := tpConfig(2, true, 1)
		cfg.Zero.Stage = 1
		ps, m, err := Build(cfg, g)
		if err != nil {
			return err
		}
		if len(ps) != 2 {
			return fmt.Errorf("want tp and zero, got %d plugins", len(ps))
		}
		if p, ok := ps[0].(*tp.TP); !ok || !p.SP {
			return fmt.Errorf("first plugin is %T", ps[0])
		}
		if _, ok := ps[1].(*zero.Zero); !ok {
			return fmt.Errorf("second plugin is %T", ps[1])
		}
		if m.TP().Size() != 2 || m.DP().Size() != 2 {
			return fmt.Errorf("mesh tp %d dp %d", m.TP().Size(), m.DP().Size())
		}
		cfg.Parallel.TP = 8
		if _, _, err := Build(cfg, g); err == nil || err.Error() != "plugins: tp 8 × cp 1 × pp 1 needs at least 8 ranks; the world has 4" {
			return fmt.Errorf("tp larger than the world: %v", err)
		}
		return nil
	}))
}

// A vocabulary that does not divide: a tp=2 checkpoint holds the real
// vocabulary (257 rows of wte, in two parts of 128 and 129) and resumes on
// one process, a one-process checkpoint resumes at tp=2, and save_to
// writes the whole table; every run equals the uninterrupted single one.
func TestTensorParallelResumeUnevenVocabulary(t *testing.T) {
	cfg := func(tpn, steps int) config.Config {
		c := tpConfig(tpn, tpn > 1, 1)
		c.Train.Steps = steps
		return c
	}
	run := func(c config.Config) ptest.Result {
		if c.Parallel.TP == 1 {
			return ptest.Single(t, c)
		}
		return ptest.Parallel(t, c, c.Parallel.TP, "local", buildFrom(c))[0]
	}
	full := run(cfg(1, 6))
	want := full
	want.Losses, want.GradNorms = full.Losses[3:], full.GradNorms[3:]
	for _, c := range []struct{ saver, resumer int }{{2, 1}, {1, 2}} {
		dir := filepath.Join(t.TempDir(), "ckpt")
		s := cfg(c.saver, 3)
		s.Checkpoint.Dir = dir
		run(s)
		ix, err := ckpt.ReadIndex(filepath.Join(dir, ckpt.StepDir(3)))
		require.NoError(t, err)
		wte := ix.Tensors["wte.weight"]
		require.Equal(t, []int{257, 64}, wte.Shape, "the checkpoint holds the real vocabulary")
		require.Len(t, wte.Parts, c.saver)
		r := cfg(c.resumer, 6)
		r.Resume = dir
		r.SaveTo = filepath.Join(t.TempDir(), "model.safetensors")
		what := fmt.Sprintf("saved at tp=%d, resumed at tp=%d", c.saver, c.resumer)
		ptest.AssertEquivalent(t, want, run(r), what)
		ptest.AssertParams(t, want.Params, ptest.LoadParams(t, r.SaveTo), what+": save_to", ptest.BoundsOf(want))
	}
}

// The bytes a rank sends per step are tp.StepBytes plus the gradient
// norm's all-reduce over the world (two float64, three under fp16), to the byte: with two
// ranks the direct algorithms of small buffers send what the ring factors
// say.
//
// Under mixed precision (bf16 and fp16) activations travel in 2 bytes and
// the formula says so (e = 2): the activation terms are half of float32's.
func TestTensorParallelCommBytes(t *testing.T) {
	for _, mp := range []string{"no", "bf16", "fp16"} {
		for _, sp := range []bool{false, true} {
			for _, accum := range []int{1, 2} {
				if mp != "no" && accum == 2 {
					continue
				}
				cfg := tpConfig(2, sp, accum)
				cfg.Train.Steps = 2
				cfg.Train.DType = "float32" // tp.StepBytes counts float32 payloads
				cfg.Train.MixedPrecision = mp
				e, norm := 4, 16.0
				if mp != "no" {
					e = 2
				}
				if mp == "fp16" {
					norm = 24 // the overflow flag of loss scaling rides with the norm
				}
				got := ptest.Parallel(t, cfg, 2, "local", buildFrom(cfg))
				want := tp.StepBytes(trainer.GPTConfig(cfg), cfg.Train.BatchSize, accum, 2, sp, e) + norm
				for r := range got {
					for s, b := range got[r].CommBytes {
						require.Equal(t, int64(want), b, "%s sp=%v accum %d rank %d step %d", mp, sp, accum, r, s)
					}
				}
			}
		}
	}
}
