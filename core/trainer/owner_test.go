package trainer_test

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// twoStages is the smallest step owner: a two-stage pipeline that runs
// all forwards of a step, then all backwards (no overlap), over the pp
// group of a mesh. Stage 0 holds the embedding and the first half of the
// blocks, stage 1 the rest and the head with its own copy of the tied wte.
type twoStages struct {
	pp    comm.Group
	evals *int
}

func (o *twoStages) Name() string { return "two-stages" }

// Prepare keeps this rank's stage and declares where each parameter lives.
func (o *twoStages) Prepare(t *trainer.Trainer) error {
	mc, s := t.Model.Config, o.pp.Rank()
	half := mc.NLayer / 2
	ranges := [][2]int{{0, half}, {half, mc.NLayer}}[s : s+1]
	m, err := nn.NewStage(mc, t.Cfg.Train.Seed, t.DType(), t.Alloc, ranges)
	if err != nil {
		return err
	}
	for _, p := range m.Params() {
		held := []int{s}
		if p.Name == "wte.weight" {
			held = []int{0, 1}
		}
		p.Spec.Along[place.PP] = place.Placement{Kind: place.Held, Ranks: held}
	}
	return t.SetModel(m)
}

// forward runs this stage on micro-batch (x, y): stage 0 sends its
// output, stage 1 receives it as a leaf and returns the loss.
func (o *twoStages) forward(t *trainer.Trainer, x, y *tensor.Tensor, info tensor.PassInfo) (out, in, loss *tensor.Tensor, err error) {
	p := nn.Pass{Info: info}
	m := t.Model
	if o.pp.Rank() == 0 {
		h, err := m.Embed.Forward(x, p)
		if err == nil {
			h, err = m.Chunks[0].Forward(h, p)
		}
		if err == nil {
			err = o.pp.Send(h, 1)
		}
		return h, nil, nil, err
	}
	B, T := x.Dim(0), x.Dim(1)
	in = t.Alloc.New(tensor.Activations, t.DType(), B, T, m.Config.NEmbd)
	if err := o.pp.Recv(in, 0); err != nil {
		return nil, nil, nil, err
	}
	in.RequiresGrad()
	h, err := m.Chunks[0].Forward(in, p)
	if err == nil {
		loss, err = m.Head.Loss(h, y, p)
	}
	return nil, in, loss, err
}

// shareLoss gives stage 0 the last stage's value.
func (o *twoStages) shareLoss(v float64) (float64, error) {
	buf := tensor.FromF64([]float64{v}, 1)
	err := o.pp.Broadcast(buf, 1)
	return buf.F64()[0], err
}

func (o *twoStages) RunStep(t *trainer.Trainer, step int) (float64, error) {
	A, B := t.Cfg.Train.GradAccum, t.Cfg.Train.BatchSize
	type mb struct{ out, in, loss *tensor.Tensor }
	var mbs []mb
	var sum float64
	for a := 0; a < A; a++ {
		info := tensor.PassInfo{Micro: a, Last: a == A-1}
		if err := t.PreForward(info); err != nil {
			return 0, err
		}
		x, y := t.Train.Batch(step, a, t.DataRank, t.DataSize, B, A)
		out, in, loss, err := o.forward(t, x, y, info)
		if err != nil {
			return 0, err
		}
		if loss != nil {
			sum += loss.Scalar()
		}
		mbs = append(mbs, mb{out, in, loss})
	}
	for a, m := range mbs {
		info := tensor.PassInfo{Micro: a, Last: a == A-1}
		if o.pp.Rank() == 1 {
			g := t.Alloc.New(tensor.Activations, t.DType(), 1)
			g.Set(0, 1/float64(A))
			err := t.BackwardFrom(m.loss, g, info)
			g.Release()
			if err != nil {
				return 0, err
			}
			if err := o.pp.Send(m.in.Grad, 0); err != nil {
				return 0, err
			}
		} else {
			g := t.Alloc.New(tensor.Activations, t.DType(), m.out.Shape()...)
			if err := o.pp.Recv(g, 1); err != nil {
				return 0, err
			}
			if err := t.BackwardFrom(m.out, g, info); err != nil {
				return 0, err
			}
		}
		if err := t.PostGrad(info); err != nil {
			return 0, err
		}
	}
	// The tied wte: the embedding's gradient on stage 0 plus the head's
	// on stage 1, on both.
	if err := o.pp.AllReduce(t.Model.Param("wte.weight").Grad, comm.Sum); err != nil {
		return 0, err
	}
	return o.shareLoss(sum / float64(A))
}

func (o *twoStages) EvalLoss(t *trainer.Trainer, x, y *tensor.Tensor) (float64, error) {
	*o.evals++
	_, _, loss, err := o.forward(t, x, y, tensor.PassInfo{Last: true})
	if err != nil {
		return 0, err
	}
	var v float64
	if loss != nil {
		v = loss.Scalar()
		tensor.FreeGraph(loss)
	}
	return o.shareLoss(v)
}

// TestStepOwnerPipeline trains through a test step owner whose ranks hold
// different stages: the step, the gradient norm, evaluation and saving go
// through the owner and the placements, and equal one process (float64,
// 1e-9).
func TestStepOwnerPipeline(t *testing.T) {
	cfg := ptest.Config64()
	cfg.Train.Steps, cfg.Train.GradAccum = 4, 2
	cfg.Train.EvalEvery, cfg.Train.EvalBatches, cfg.Data.ValFraction = 2, 2, 0.2
	dir := t.TempDir()
	single := cfg
	single.SaveTo = filepath.Join(dir, "single.safetensors")
	want := ptest.Single(t, single)
	cfg.SaveTo = filepath.Join(dir, "pp.safetensors")
	var mu sync.Mutex
	evals := map[int]*int{}
	got := ptest.Parallel(t, cfg, 2, "local", func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) {
		m, err := mesh.New(g, 1, 1, 1, 2)
		if err != nil {
			return nil, nil, err
		}
		n := new(int)
		mu.Lock()
		evals[g.Rank()] = n
		mu.Unlock()
		return []trainer.Plugin{&twoStages{pp: m.PP(), evals: n}}, m, nil
	})
	for r := range got {
		ptest.AssertEquivalent(t, want, got[r], fmt.Sprintf("pipeline rank %d", r))
		// 2 evaluations of 2 batches, each of 2 micro-batches.
		require.Equal(t, 2*2*2, *evals[r], "rank %d: evaluations go through the owner", r)
	}
	require.Contains(t, got[0].Local, "wte.weight")
	require.NotContains(t, got[0].Local, "ln_f.weight", "stage 0 holds no head")
	require.NotContains(t, got[1].Local, "h.0.ln_1.weight", "stage 1 holds no first block")
	require.Equal(t, got[0].Local["wte.weight"], got[1].Local["wte.weight"], "the tied copies stay equal")
	// The saved files hold the weights each run trained: the one process's
	// file its own parameters exactly, the pipeline's file the same weights
	// under the harness's bound.
	mine, theirs := ptest.LoadParams(t, single.SaveTo), ptest.LoadParams(t, cfg.SaveTo)
	require.Equal(t, want.Params["wpe.weight"], mine["wpe.weight"])
	ptest.AssertParams(t, mine, theirs, "saved weights", ptest.BoundsOf(want))
}

// meanOver is a LossReducer over one group of the mesh.
type meanOver struct {
	name string
	g    comm.Group
}

func (m meanOver) Name() string { return m.name }
func (m meanOver) ReduceLoss(t *trainer.Trainer, loss float64) (float64, error) {
	return t.MeanOver(m.g, loss)
}

// TestLossReducedOverEachGroupThatSplitsTheBatch: on a dp 2 × cp 2 × tp 2
// mesh, a reducer over dp and one over cp compose into the mean over the
// four ranks that hold different tokens; the tp ranks, which compute the
// same loss, are not averaged again.
func TestLossReducedOverEachGroupThatSplitsTheBatch(t *testing.T) {
	cfg := ptest.Config()
	got := make([]float64, 8)
	require.NoError(t, comm.RunLocal(8, comm.Options{}, func(g comm.Group) error {
		m, err := mesh.New(g, 2, 2, 2, 1)
		if err != nil {
			return err
		}
		ps := []trainer.Plugin{meanOver{"cp", m.CP()}, meanOver{"dp", m.DP()}}
		tr, err := trainer.New(cfg, trainer.Options{Train: ptest.Corpus(), Plugins: ps, Mesh: m, Rank: g.Rank(), World: 8})
		if err != nil {
			return err
		}
		// Each (dp, cp) pair has its own loss; both tp ranks share it.
		c := m.Coord()
		s, err := tr.Update(0, float64(1+c.CP+2*c.DP))
		got[g.Rank()] = s.Loss
		return err
	}))
	for r, v := range got {
		require.Equal(t, 2.5, v, "rank %d", r)
	}
}
