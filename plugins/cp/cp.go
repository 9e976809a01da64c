package cp

import (
	"errors"
	"fmt"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/data"
	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trace"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// CP is the context-parallel plugin of one rank: a model rewriter that
// gives the rank its chunks of every sequence and the attention core that
// sees the rest of the sequence through the CP group. It comes after
// tensor parallel (it replaces the attention core tensor parallel
// installed, keeping its heads) and before the step owner and data
// parallel.
type CP struct {
	// Ring picks ring attention; otherwise keys and values are
	// all-gathered.
	Ring bool
	// Split is Zigzag or Contiguous.
	Split string
	// ReduceGrads makes the plugin average every gradient over the CP
	// group itself: for a run whose data-parallel plugin
	// reduces over the DP group only (ZeRO, DDP as a plugin process), or
	// has none. Plain DDP reduces over the DP × CP group instead.
	ReduceGrads bool
	// Stats counts this rank's attention work (all layers).
	Stats Stats

	m   *mesh.Mesh
	pos [][]int
}

var (
	_ trainer.Preparer    = (*CP)(nil)
	_ trainer.GradReadier = (*CP)(nil)
)

// New returns the context-parallel plugin over m's CP group: attention
// "ring" or "allgather", split "zigzag" or "contiguous".
func New(m *mesh.Mesh, attention, split string, reduceGrads bool) (*CP, error) {
	if m == nil || m.CP() == nil {
		return nil, errors.New("cp: no context-parallel group (a nil mesh)")
	}
	if attention != "ring" && attention != "allgather" {
		return nil, fmt.Errorf("cp: cp.attention=%q is not supported: use ring or allgather", attention)
	}
	if split != Zigzag && split != Contiguous {
		return nil, fmt.Errorf("cp: cp.split=%q is not supported: use %s or %s", split, Zigzag, Contiguous)
	}
	return &CP{Ring: attention == "ring", Split: split, ReduceGrads: reduceGrads, m: m}, nil
}

// Name implements trainer.Plugin.
func (p *CP) Name() string { return "cp" }

// Positions are the global positions this rank holds of every sequence
// (nil before Prepare).
func (p *CP) Positions() []int {
	if p.pos == nil {
		return nil
	}
	return p.pos[p.m.CPRank()]
}

// Prepare points the data loaders at this rank's columns of every window
// (the same windows as the other ranks of its CP group read: the data rank
// is the DP rank), gives the embedding their global positions, and
// replaces every block's attention core by Attention over the CP group.
// Parameters are untouched: replicated along CP, as their placement
// (place.Replicate, the zero value) already says.
func (p *CP) Prepare(t *trainer.Trainer) error {
	g := p.m.CP()
	n := g.Size()
	T := t.Model.Config.BlockSize
	all, err := AllPositions(p.Split, T, n)
	if err != nil {
		return err
	}
	if sp := t.Cfg.TP.SequenceParallel && t.Cfg.Parallel.TP > 1; sp && (T/n)%t.Cfg.Parallel.TP != 0 {
		return fmt.Errorf("cp: a rank's %d rows of each sequence do not split over tp=%d for sequence parallel; choose block_size a multiple of %d",
			T/n, t.Cfg.Parallel.TP, Parts(p.Split, n)*t.Cfg.Parallel.TP)
	}
	p.pos = all
	mine := all[g.Rank()]
	for _, l := range []*data.Loader{t.Train, t.Val} {
		if l == nil {
			continue
		}
		if err := l.KeepColumns(mine); err != nil {
			return err
		}
	}
	if e := t.Model.Embed; e != nil {
		e.Layer = &Embedding{Inner: e.Layer, Pos: mine}
	}
	if h := t.Model.Head; h != nil {
		h.Out = &Head{HeadLoss: h.Out, G: g, Trace: t.Trace}
	}
	for _, b := range t.Model.Blocks() {
		c, ok := b.Core.(*nn.CausalAttention)
		if !ok {
			return fmt.Errorf("cp: %s's attention core is %T, not nn.CausalAttention; context parallel replaces the plain core (after tensor parallel)", b.Name(), b.Core)
		}
		b.Core = &Attention{NHead: c.NHead, NKVHead: c.NKVHead, RopeTheta: c.RopeTheta, G: g, Pos: all, Ring: p.Ring, Alloc: t.Alloc, Trace: t.Trace, Stats: &p.Stats}
		if t.Cfg.LoRA.Rank > 0 && t.Cfg.LoRA.Dropout > 0 {
			// LoRA's dropout draws an element's mask by its position
			// (nn.Adapter.Drop): the linear layers are told this rank's.
			for s := nn.SlotAttn; s <= nn.SlotMlpProj; s++ {
				l := b.Layer(s)
				*l = &Positioned{Inner: *l, Pos: mine}
			}
		}
	}
	return nil
}

// Positioned runs Inner on rows at the global positions Pos (this rank's
// of each sequence).
type Positioned struct {
	Inner nn.Layer
	Pos   []int
}

// Forward implements nn.Layer.
func (l *Positioned) Forward(x *tensor.Tensor, p nn.Pass) (*tensor.Tensor, error) {
	p.Pos = l.Pos
	return l.Inner.Forward(x, p)
}

// GradReady implements trainer.GradReadier: with ReduceGrads, p's
// gradient is averaged over the CP group as soon as it is final for the
// micro-batch, before the data-parallel plugin (later in the order) sees
// it. The average of an accumulated gradient is the accumulation of the
// averages, so averaging after every micro-batch is exact.
func (p *CP) GradReady(t *trainer.Trainer, q *tensor.Tensor, _ tensor.PassInfo) error {
	if !p.ReduceGrads || q.Grad == nil {
		return nil
	}
	g := p.m.CP()
	span := t.Trace.Begin("all_reduce "+q.Name+" cp", "comm", trace.Comm).With("bytes", q.Grad.Bytes()).With("group", g.Name())
	err := g.AllReduce(q.Grad, comm.Avg)
	span.End()
	if err != nil {
		return fmt.Errorf("cp: rank %d: average of %s's gradient over group %s: %w", g.Rank(), q.Name, g.Name(), err)
	}
	return nil
}

// Embedding is the input layer of a context-parallel rank: Inner (the
// model's embedding, maybe vocabulary-parallel) on this rank's tokens of
// each sequence, told their global positions so that the position
// embedding is that of the whole sequence.
type Embedding struct {
	Inner nn.Layer
	Pos   []int
}

// Forward implements nn.Layer on token ids idx [B, len(Pos)].
func (e *Embedding) Forward(idx *tensor.Tensor, p nn.Pass) (*tensor.Tensor, error) {
	if idx.Dim(-1) != len(e.Pos) {
		return nil, fmt.Errorf("cp: the embedding got %d tokens of each sequence; this rank holds %d (positions %d..%d of its chunks): context parallel runs on whole block_size windows", idx.Dim(-1), len(e.Pos), e.Pos[0], e.Pos[len(e.Pos)-1])
	}
	p.Pos = e.Pos
	return e.Inner.Forward(idx, p)
}

// Head is the output layer of a context-parallel rank: Inner's loss over
// this rank's tokens, whose value the forward replaces by the mean over
// the CP group (one all-reduce of a scalar) and whose gradient is left
// alone. Every rank's loss is its mean over equally many tokens (B
// sequences × T/cp positions), so the mean of the ranks' means is the mean
// over every token of the sequences: what one process reports, in
// training and in evaluation alike. The gradient stays that of the rank's
// own mean; the data-parallel average of those over DP × CP (or over CP
// by ReduceGrads, then DP) is the gradient of the global mean.
type Head struct {
	nn.HeadLoss
	G     comm.Group
	Trace *trace.Recorder
}

// Loss implements nn.HeadLoss.
func (h *Head) Loss(x, targets *tensor.Tensor, p nn.Pass) (*tensor.Tensor, error) {
	loss, err := h.HeadLoss.Loss(x, targets, p)
	if err != nil {
		return nil, err
	}
	return tensor.Apply("cp.mean_loss", &meanLossFn{h: h}, loss)
}

type meanLossFn struct{ h *Head }

func (f *meanLossFn) Forward(_ *tensor.FuncCtx, in ...*tensor.Tensor) (*tensor.Tensor, error) {
	g := f.h.G
	v := tensor.FromF64([]float64{in[0].Scalar()}, 1)
	span := f.h.Trace.Begin("all_reduce loss cp", "comm", trace.Comm).With("bytes", v.Bytes()).With("group", g.Name())
	err := g.AllReduce(v, comm.Avg)
	span.End()
	if err != nil {
		return nil, fmt.Errorf("cp: rank %d: mean of the loss over group %s: %w", g.Rank(), g.Name(), err)
	}
	out := tensor.New(in[0].DType(), in[0].Shape()...)
	out.Set(0, v.F64()[0])
	return out, nil
}

func (f *meanLossFn) Backward(_ *tensor.FuncCtx, g *tensor.Tensor) ([]*tensor.Tensor, error) {
	return []*tensor.Tensor{g}, nil
}
