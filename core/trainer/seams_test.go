package trainer

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// halves is a Linear that computes its output in two halves of columns
// and concatenates them: a stand-in for a strategy's replacement layer.
type halves struct{ w, b *tensor.Tensor }

func (h *halves) Forward(x *tensor.Tensor, _ nn.Pass) (*tensor.Tensor, error) {
	n := h.w.Dim(1)
	k := n / 2
	lo := tensor.Linear(x, tensor.Columns(h.w, 0, k), tensor.Columns(h.b, 0, k))
	hi := tensor.Linear(x, tensor.Columns(h.w, k, n), tensor.Columns(h.b, k, n))
	return tensor.Concat(lo, hi), nil
}

// splitter swaps every block's Linear layers for halves in Prepare, from
// outside the core, the way a strategy attaches.
type splitter struct{ swapped int }

func (s *splitter) Name() string { return "splitter" }

func (s *splitter) Prepare(t *Trainer) error {
	for _, b := range t.Model.Blocks() {
		for _, l := range []*nn.Layer{&b.Attn, &b.AttnProj, &b.Fc, &b.MlpProj} {
			d := (*l).(*nn.Dense)
			*l = &halves{w: d.W, b: d.B}
			s.swapped++
		}
	}
	return nil
}

func TestReplacedLinearsTrainLikePlain(t *testing.T) {
	cfg := smallConfig()
	cfg.Train.Steps = 5
	want := runLosses(t, cfg)
	sp := &splitter{}
	var steps []StepMetrics
	tr, err := New(cfg, Options{Train: corpus[:4000], Val: corpus[4000:], Plugins: []Plugin{sp},
		OnStep: func(m StepMetrics) { steps = append(steps, m) }})
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, 4*cfg.Model.NLayer, sp.swapped)
	require.Len(t, steps, 5)
	for i, s := range steps {
		require.InEpsilon(t, want[i], s.Loss, 1e-6, "step %d", i)
	}
}

// TestStageChainEqualsWhole runs a 3-block model as three stages, one
// after another in one process, passing activations forward and their
// gradients back by hand through BackwardFrom, as a pipeline does.
func TestStageChainEqualsWhole(t *testing.T) {
	mc := nn.GPTConfig{NLayer: 3, NHead: 2, NEmbd: 16, BlockSize: 8, VocabSize: 40}
	whole, err := nn.NewGPT(mc, 5, tensor.Float32, nil)
	require.NoError(t, err)
	idx := tensor.FromI32([]int32{1, 5, 3, 9, 0, 2, 4, 4, 7, 10, 6, 1, 3, 3, 8, 2}, 2, 8)
	tgt := tensor.FromI32([]int32{5, 3, 9, 0, 2, 8, 4, 7, 10, 6, 1, 3, 3, 8, 2, 0}, 2, 8)
	cfg := smallConfig()
	trainerOf := func(m *nn.GPT) *Trainer {
		tr, err := NewWith(cfg, m, nil, nil, nil, Options{})
		require.NoError(t, err)
		return tr
	}
	loss, err := whole.Loss(idx, tgt, nn.Pass{})
	require.NoError(t, err)
	wantLoss := loss.Scalar()
	require.NoError(t, trainerOf(whole).BackwardFrom(loss, scalar(1), tensor.PassInfo{Last: true}))

	var stages []*nn.GPT
	for _, r := range [][2]int{{0, 1}, {1, 2}, {2, 3}} {
		s, err := nn.NewStage(mc, 5, tensor.Float32, nil, [][2]int{r})
		require.NoError(t, err)
		stages = append(stages, s)
	}
	require.NotNil(t, stages[0].Embed)
	require.Nil(t, stages[1].Embed)
	require.Nil(t, stages[1].Head)
	require.NotNil(t, stages[2].Head)
	require.Equal(t, []string{"embed", "h.0"}, moduleNames(stages[0]))
	require.Equal(t, []string{"h.1"}, moduleNames(stages[1]))
	require.Equal(t, []string{"h.2", "head"}, moduleNames(stages[2]))

	// Forward: each stage's input is a fresh leaf, as if received.
	info := nn.Pass{Info: tensor.PassInfo{Last: true}}
	out0, err := stages[0].Embed.Forward(idx, info)
	require.NoError(t, err)
	out0, err = stages[0].Chunks[0].Forward(out0, info)
	require.NoError(t, err)
	in1 := received(out0)
	out1, err := stages[1].Chunks[0].Forward(in1, info)
	require.NoError(t, err)
	in2 := received(out1)
	x, err := stages[2].Chunks[0].Forward(in2, info)
	require.NoError(t, err)
	last, err := stages[2].Head.Loss(x, tgt, info)
	require.NoError(t, err)
	require.InEpsilon(t, wantLoss, last.Scalar(), 1e-6)

	// Backward, last stage first, handing each input's gradient back.
	require.NoError(t, trainerOf(stages[2]).BackwardFrom(last, scalar(1), info.Info))
	require.NoError(t, trainerOf(stages[1]).BackwardFrom(out1, in2.Grad, info.Info))
	require.NoError(t, trainerOf(stages[0]).BackwardFrom(out0, in1.Grad, info.Info))

	for _, p := range whole.Params() {
		var got []float64
		for _, s := range stages {
			if q := s.Param(p.Name); q != nil {
				g := q.Grad.Float64s()
				if got == nil {
					got = g
					continue
				}
				// The tied wte: the first stage's embedding gradient plus
				// the last stage's head gradient.
				for i := range got {
					got[i] += g[i]
				}
			}
		}
		require.NotNil(t, got, "no stage holds %s", p.Name)
		require.LessOrEqual(t, normRel(got, p.Grad.Float64s()), 1e-6, "gradient of %s", p.Name)
	}
}

func moduleNames(m *nn.GPT) []string {
	var out []string
	for _, mod := range m.Modules() {
		out = append(out, mod.Name())
	}
	return out
}

// received is what a stage gets from the previous one: the values, as a
// leaf whose gradient backward fills in.
func received(x *tensor.Tensor) *tensor.Tensor {
	in := tensor.New(x.DType(), x.Shape()...)
	in.CopyFrom(x)
	return in.RequiresGrad()
}

func scalar(v float64) *tensor.Tensor { return tensor.FromF32([]float32{float32(v)}, 1) }

// recorder logs every hook it sees, under its own name.
type recorder struct {
	name string
	log  *[]string
}

func (r *recorder) add(format string, args ...any) {
	*r.log = append(*r.log, r.name+" "+fmt.Sprintf(format, args...))
}

func (r *recorder) Name() string { return r.name }
func (r *recorder) Prepare(t *Trainer) error {
	r.add("prepare")
	return nil
}
func (r *recorder) PreForward(t *Trainer, info tensor.PassInfo) error {
	r.add("pre-forward %d", info.Micro)
	return nil
}
func (r *recorder) GradReady(t *Trainer, p *tensor.Tensor, info tensor.PassInfo) error {
	if p.Name == "wte.weight" { // the last gradient of every backward
		r.add("grad-ready %s %d", p.Name, info.Micro)
	}
	return nil
}
func (r *recorder) PostGrad(t *Trainer, info tensor.PassInfo) error {
	r.add("post-grad %d", info.Micro)
	return nil
}
func (r *recorder) ReduceLoss(t *Trainer, loss float64) (float64, error) {
	r.add("reduce-loss")
	return loss, nil
}
func (r *recorder) PreStep(t *Trainer) error {
	r.add("pre-step")
	return nil
}
func (r *recorder) PostStep(t *Trainer, m *StepMetrics) error {
	r.add("post-step %d", m.Step)
	return nil
}
func (r *recorder) Finish(t *Trainer) error {
	r.add("finish")
	return nil
}

// TestHookOrder: side-effect hooks run in plugin order, each hook for
// every plugin before the next hook; value hooks chain in the same order.
func TestHookOrder(t *testing.T) {
	cfg := smallConfig()
	cfg.Train.Steps, cfg.Train.GradAccum, cfg.Train.EvalEvery = 1, 2, 0
	var log []string
	a, b := &recorder{"a", &log}, &recorder{"b", &log}
	tr, err := New(cfg, Options{Train: corpus[:4000], Plugins: []Plugin{a, b}})
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, []string{
		"a prepare", "b prepare",
		"a pre-forward 0", "b pre-forward 0",
		"a grad-ready wte.weight 0", "b grad-ready wte.weight 0",
		"a post-grad 0", "b post-grad 0",
		"a pre-forward 1", "b pre-forward 1",
		"a grad-ready wte.weight 1", "b grad-ready wte.weight 1",
		"a post-grad 1", "b post-grad 1",
		"a reduce-loss", "b reduce-loss",
		"a pre-step", "b pre-step",
		"a post-step 1", "b post-step 1", // the metrics count completed steps
		"a finish", "b finish",
	}, log)
}
