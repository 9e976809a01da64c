package zero

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trace"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// sizes are the element counts of the model's units, computed from the
// GPT-2 shapes (not from the layout under test), each padded to n.
type sizes struct {
	psi    int   // parameters, no padding
	padded int   // all units, padded
	embed  int   // the embed unit, padded
	others []int // blocks then head, padded, in forward order
}

func unitSizes(cfg config.Config, n int) sizes {
	V, C, T, L := cfg.Model.VocabSize, cfg.Model.NEmbd, cfg.Model.BlockSize, cfg.Model.NLayer
	pad := func(x int) int { return (x + n - 1) / n * n }
	embed, block, head := V*C+T*C, 12*C*C+13*C, 2*C
	s := sizes{psi: embed + L*block + head, embed: pad(embed)}
	for i := 0; i < L; i++ {
		s.others = append(s.others, pad(block))
	}
	s.others = append(s.others, pad(head))
	s.padded = s.embed
	for _, o := range s.others {
		s.padded += o
	}
	return s
}

// maxPair is the largest sum of two units adjacent in forward order (the
// unit being computed and the one prefetched, or the one whose gradient
// is being produced and the one still being reduce-scattered).
func (s sizes) maxPair() int {
	m := 0
	for i := 0; i+1 < len(s.others); i++ {
		m = max(m, s.others[i]+s.others[i+1])
	}
	return m
}

// gathered is the most stage 3 gathers at once: two adjacent units, or
// the embed unit with the head and the last block (prefetched during the
// head's backward).
func (s sizes) gathered() int {
	L := len(s.others) - 1
	return max(s.maxPair(), s.embed+s.others[L-1]+s.others[L])
}

// TestMemoryMatchesFormulas holds each rank's steady memory (the
// allocator's peaks after Prepare) to the fp32 AdamW formulas:
// params 4Ψ, grads 4Ψ, moments 8Ψ, each divided by N where the stage
// shards it, within 5%, plus the buffers doc.go documents:
//
//	stage 1: none (the reduced shard is copied back into the full gradient)
//	stage 2: grads = shard + the embed unit + two adjacent units in flight
//	stage 3: grads as stage 2; params = shard + the units gathered at once
//
// and padding (every unit rounded up to a multiple of N).
func TestMemoryMatchesFormulas(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		for _, stage := range []int{1, 2, 3} {
			t.Run(fmt.Sprintf("n%d/stage%d", n, stage), func(t *testing.T) {
				cfg := parallelConfig(stage, n, 1)
				cfg.Train.Steps = 2
				s := unitSizes(cfg, n)
				psi, P, N := float64(s.psi), float64(s.padded), float64(n)
				transient := 4 * float64(s.embed+s.maxPair())
				// formula: docs/formulas.md; want: formula + padding + buffers.
				type row struct{ formula, want float64 }
				var params, grads row
				optim := row{8 * psi / N, 8 * psi / N}
				switch stage {
				case 1:
					params = row{4 * psi, 4 * P}
					grads = row{4 * psi, 4 * P}
				case 2:
					params = row{4 * psi, 4 * P}
					grads = row{4 * psi / N, 4*P/N + transient}
				case 3:
					params = row{4 * psi / N, 4*P/N + 4*float64(s.gathered())}
					grads = row{4 * psi / N, 4*P/N + transient}
				}
				runs := runRanks(t, cfg, n, stage)
				var optimSum int64
				for r, run := range runs {
					m := run.Memory
					for _, c := range []struct {
						what string
						got  int64
						row  row
					}{{"params", m.ParamsBytes, params}, {"grads", m.GradsBytes, grads}, {"optimizer state", m.OptimBytes, optim}} {
						require.LessOrEqual(t, math.Abs(float64(c.got)-c.row.want), 0.05*c.row.formula,
							"rank %d %s: %d bytes, want %.0f (formula %.0f)", r, c.what, c.got, c.row.want, c.row.formula)
					}
					// Parameters and gradients are fully determined by the
					// unit sizes: hold them exactly.
					require.Equal(t, int64(params.want), m.ParamsBytes, "rank %d params", r)
					require.Equal(t, int64(grads.want), m.GradsBytes, "rank %d grads", r)
					optimSum += m.OptimBytes
				}
				// The shards partition the parameters: the moments of all
				// ranks together are exactly those of one unsharded AdamW.
				require.Equal(t, int64(8*s.psi), optimSum, "optimizer state summed over ranks")
				// Rank 0 reports every rank.
				all := runs[0].Result.Memory
				require.Len(t, all, n)
				for r, run := range runs {
					// The resident peak is the process's, which goroutine
					// ranks share and which grows between the two reads.
					mine, gathered := run.Memory, all[r]
					require.Positive(t, gathered.RSSPeakBytes, "rank %d rss_peak_bytes", r)
					mine.RSSPeakBytes, gathered.RSSPeakBytes = 0, 0
					require.Equal(t, mine, gathered, "rank 0's copy of rank %d's report", r)
				}
			})
		}
	}
}

// TestTraceCommunication checks that every collective is traced on the
// comm track with its size, and that the traffic is the formulas': per
// micro-batch stage 3 gathers the parameters for forward, the embed unit
// again for the head's logits, and the blocks for backward (the head's
// backward follows its forward; the embedding's reads no weight), and
// reduce-scatters the gradients once, about 3Ψ;
// stages 1 and 2 reduce-scatter Ψ and all-gather Ψ per step, 2Ψ. Set-up
// sends nothing: the initial values are computed where they are held.
func TestTraceCommunication(t *testing.T) {
	const n, accum, steps = 2, 2, 3
	for _, stage := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("stage%d", stage), func(t *testing.T) {
			cfg := parallelConfig(stage, n, accum)
			cfg.Train.Steps = steps
			s := unitSizes(cfg, n)
			rs := ptest.Parallel(t, cfg, n, "local", build(stage))
			blocks := 0
			for _, o := range s.others[:len(s.others)-1] {
				blocks += o
			}
			var wantAG, wantRS int
			switch stage {
			case 1:
				wantAG, wantRS = steps*s.padded, steps*s.padded
			case 2:
				wantAG, wantRS = steps*s.padded, steps*accum*s.padded
			case 3:
				wantAG, wantRS = steps*accum*(s.padded+s.embed+blocks), steps*accum*s.padded
			}
			for r, res := range rs {
				bytes := map[string]int{}
				for _, e := range res.Trace {
					if e.Cat != "comm" {
						continue
					}
					require.Equal(t, trace.Comm, e.TID, "rank %d span %s", r, e.Name)
					b, ok := e.Args["bytes"].(int64)
					require.True(t, ok, "rank %d span %s has no bytes", r, e.Name)
					bytes[strings.Fields(e.Name)[0]] += int(b)
				}
				require.Equal(t, 4*wantAG+8*10*n, bytes["all_gather"], "rank %d: all-gather bytes (parameters + memory reports)", r)
				require.Equal(t, 4*wantRS, bytes["reduce_scatter"], "rank %d: reduce-scatter bytes", r)
				require.Zero(t, bytes["broadcast"], "rank %d: no broadcast: each rank fills its own parts from (seed, name, element index)", r)
				require.Equal(t, (8+16)*steps, bytes["all_reduce"], "rank %d: loss and grad-norm (with the stop flag) all-reduces", r)
			}
		})
	}
}

// TestStage3ReleasesEveryUnit samples, at every module hook of every
// micro-batch (after ZeRO's own), the parameter bytes the rank holds and
// whether the tied table wte has storage. A vocabulary four times a
// block's size makes wte the largest unit. Stage 3 gathers each unit for
// its forward and its backward only: wte is held for the embedding's
// forward and during the head's forward and backward and nowhere else (a
// block's hooks never see it, nor does the embedding's backward, which
// reads no weight), and the
// resident parameters stay within the shards plus two units (two
// adjacent blocks, or the embed unit and the last block prefetched during
// the head's backward) and the head's ln_f. The buffers set-up freed are
// given back to the heap, not kept for reuse.
func TestStage3ReleasesEveryUnit(t *testing.T) {
	const n = 2
	cfg := parallelConfig(3, n, 2)
	cfg.Model.VocabSize = 1024
	cfg.Train.Steps = 2
	s := unitSizes(cfg, n)
	L := cfg.Model.NLayer
	block, head := s.others[0], s.others[L]
	require.Greater(t, s.embed, 2*block, "the test needs wte to dwarf a block")
	bound := int64(4*s.padded/n + 4*max(s.maxPair(), s.embed+block+head))
	type sample struct {
		where  string
		params int64
		wte    bool
	}
	samples := make([][]sample, n)
	err := comm.RunLocal(n, comm.Options{}, func(g comm.Group) error {
		tr, err := stageTrainer(cfg, g, 3)
		if err != nil {
			return err
		}
		// Set-up released the unsharded parameters and optimizer state;
		// none of it may stay in the allocator's free lists.
		if b := tr.Alloc.PooledBytes(); b != 0 {
			return fmt.Errorf("%d bytes of set-up buffers kept in the allocator's free lists", b)
		}
		wte := tr.Model.Embed.Wte
		for _, mod := range tr.Model.Modules() {
			at := func(what string) nn.HookFunc {
				return func(mod *nn.Module, info tensor.PassInfo) {
					samples[g.Rank()] = append(samples[g.Rank()], sample{fmt.Sprintf("%s %s micro %d", mod.Name(), what, info.Micro),
						tr.Alloc.Usage().Current[tensor.Params], wte.HasStorage()})
				}
			}
			h := &mod.Hooks
			h.PreForward = append(h.PreForward, at("pre-forward"))
			h.PostForward = append(h.PostForward, at("post-forward"))
			h.PreBackward = append(h.PreBackward, at("pre-backward"))
			h.PostBackward = append(h.PostBackward, at("post-backward"))
		}
		_, err = tr.Run(context.Background())
		return err
	})
	require.NoError(t, err)
	for r, ss := range samples {
		// 2 steps × 2 micro-batches: every module's forward hooks, every
		// module's pre-backward and all but the embedding's post-backward
		// (its input, token ids, takes no gradient).
		require.Len(t, ss, 2*2*(4*(L+2)-1), "rank %d hook samples", r)
		for _, x := range ss {
			require.LessOrEqual(t, x.params, bound, "rank %d at %s: resident parameter bytes", r, x.where)
			wantWte := strings.HasPrefix(x.where, "embed pre-forward") ||
				(strings.HasPrefix(x.where, "head ") && !strings.HasPrefix(x.where, "head post-backward"))
			require.Equal(t, wantWte, x.wte, "rank %d at %s: wte gathered", r, x.where)
		}
	}
}

// TestStage3ReusesReleasedBuffers runs stage 3 step by step and reads the
// storage each step took from the Go heap rather than from the
// allocator's free lists (Allocator.FreshBytes). The first step takes
// what a step holds at once; every later one takes none: each unit
// gathered, released and gathered again, each gradient buffer reduced
// and released, each activation, comes back from the free lists, so a
// step leaves no garbage for the collector. A vocabulary that makes the
// tied table dwarf everything else checks that one table-sized buffer
// serves the step: the table's gradient takes the storage of its
// gathered values (NeedGrad), so the first step takes less than two
// beside the comm buffer the second micro-batch's reduce-scatter of the
// table borrows (its shard).
func TestStage3ReusesReleasedBuffers(t *testing.T) {
	const n, steps = 2, 4
	cfg := parallelConfig(3, n, 2)
	cfg.Model.NEmbd, cfg.Model.VocabSize = 128, 32768
	cfg.Train.BatchSize, cfg.Train.Steps = 1, steps
	s := unitSizes(cfg, n)
	table := int64(4 * s.embed)
	fresh := make([][]int64, n)
	err := comm.RunLocal(n, comm.Options{}, func(g comm.Group) error {
		tr, err := stageTrainer(cfg, g, 3)
		if err != nil {
			return err
		}
		before := tr.Alloc.FreshBytes()
		for step := 0; step < steps; step++ {
			if _, err := tr.Step(step); err != nil {
				return err
			}
			now := tr.Alloc.FreshBytes()
			fresh[g.Rank()] = append(fresh[g.Rank()], now-before)
			before = now
		}
		return nil
	})
	require.NoError(t, err)
	for r, f := range fresh {
		t.Logf("rank %d: bytes taken from the heap per step %v (the table: %d)", r, f, table)
		require.Positive(t, f[0], "rank %d: the first step's buffers", r)
		require.Less(t, f[0], 2*table+table/n, "rank %d: the first step took two table-sized buffers or more", r)
		for step := 1; step < steps; step++ {
			require.Zero(t, f[step], "rank %d step %d: bytes taken from the heap instead of the free lists", r, step)
		}
	}
}

// stageTrainer is rank g.Rank()'s trainer of cfg under ZeRO stage on the
// test corpus.
func stageTrainer(cfg config.Config, g comm.Group, stage int) (*trainer.Trainer, error) {
	ps, m, err := build(stage)(g)
	if err != nil {
		return nil, err
	}
	return trainer.New(cfg, trainer.Options{Train: ptest.Corpus(), Plugins: ps, Mesh: m, Rank: g.Rank(), World: g.Size()})
}
