package tp

import (
	"errors"
	"fmt"

	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// TP is the tensor-parallel plugin of one rank: a model rewriter (it
// implements only trainer.Preparer). It must come first among the plugins,
// before data parallel, which then works on the shards it leaves.
type TP struct {
	// SP turns sequence parallelism on: the LayerNorm regions hold
	// 1/N of the sequence.
	SP bool

	m *mesh.Mesh
	c *Comm
}

var _ trainer.Preparer = (*TP)(nil)

// New returns the tensor-parallel plugin over m's TP group, with sequence
// parallelism when sp is set.
func New(m *mesh.Mesh, sp bool) (*TP, error) {
	if m == nil || m.TP() == nil {
		return nil, errors.New("tp: no tensor-parallel group (a nil mesh)")
	}
	return &TP{SP: sp, m: m}, nil
}

// Name implements trainer.Plugin.
func (p *TP) Name() string {
	if p.SP {
		return "tp+sp"
	}
	return "tp"
}

// Comm is the group the layers communicate over (nil before Prepare).
func (p *TP) Comm() *Comm { return p.c }

// Check reports a model the group cannot split: heads, width or
// vocabulary that do not divide as tensor parallel needs, or, under
// sequence parallelism, a context that does not split into n parts.
// config.Validate reports the same before any rank starts.
func Check(c nn.GPTConfig, n int, sp bool) error {
	var errs []error
	if c.NHead%n != 0 {
		errs = append(errs, fmt.Errorf("tp: n_head=%d is not divisible by tp=%d", c.NHead, n))
	}
	if c.NEmbd%n != 0 {
		errs = append(errs, fmt.Errorf("tp: n_embd=%d is not divisible by tp=%d", c.NEmbd, n))
	}
	if c.VocabSize < n {
		errs = append(errs, fmt.Errorf("tp: vocab_size=%d is smaller than tp=%d", c.VocabSize, n))
	}
	if sp && c.BlockSize%n != 0 {
		errs = append(errs, fmt.Errorf("tp: sequence parallel needs block_size=%d divisible by tp=%d", c.BlockSize, n))
	}
	if c.Llama != nil && c.KVHeads()%n != 0 {
		errs = append(errs, fmt.Errorf("tp: n_kv_head=%d is not divisible by tp=%d", c.KVHeads(), n))
	}
	if c.Llama != nil && c.FFN()%n != 0 {
		errs = append(errs, fmt.Errorf("tp: intermediate_size=%d is not divisible by tp=%d", c.FFN(), n))
	}
	return errors.Join(errs...)
}

// Prepare replaces every parameter the group splits by this rank's part
// of it (registered under the same name, with its placement along the TP
// axis) and the layers that use them by their parallel forms:
//
//	attn.c_attn    column-parallel, the q, k and v columns of this
//	               rank's heads (nn.QKVShard); the attention core runs
//	               on those heads
//	attn.c_proj    row-parallel, the rows of this rank's heads
//	mlp.c_fc       column-parallel
//	mlp.c_proj     row-parallel
//	experts        in a MoE block, each expert's c_fc and c_proj as the
//	               MLP's; the router whole
//	wte            rows [lo, hi) of the vocabulary (VocabRange): the
//	               embedding and the tied head become vocab-parallel
//	ln_1, ln_2,    under sequence parallelism: LayerNorms of this rank's
//	ln_f           part of the sequence, their gradients summed
//
// LayerNorm weights, the row-parallel biases and wpe stay whole on every
// rank (replicated along TP). On a described model (trainer.New) the parts
// are placed without storage: the trainer allocates and fills only them.
// A model built with its weights (NewWith) has each part cut from the
// whole tensor, and its optimizer rebuilt over the parts.
func (p *TP) Prepare(t *trainer.Trainer) error {
	g := p.m.TP()
	n, r := g.Size(), g.Rank()
	p.c = &Comm{G: g, Alloc: t.Alloc, Trace: t.Trace}
	mc := t.Model.Config
	if err := Check(mc, n, p.SP); err != nil {
		return err
	}
	C, H := mc.NEmbd, mc.NHead
	hs := C / H
	h0, h1 := r*H/n, (r+1)*H/n
	f := 4 * C / n
	coord := t.Coord()
	var released []*tensor.Tensor
	split := func(mod *nn.Module, q *tensor.Tensor, pl place.Placement) (*tensor.Tensor, error) {
		s, err := shard(t.Alloc, coord, mod, q, pl)
		if err == nil {
			released = append(released, q)
		}
		return s, err
	}
	rows := func(lo, n int) place.Placement {
		return place.Placement{Kind: place.Shard, Dim: 0, Offset: lo, Length: n}
	}
	cols := func(dim, lo, n int) place.Placement {
		return place.Placement{Kind: place.Shard, Dim: dim, Offset: lo, Length: n}
	}
	blocks, embed, head := t.Model.Blocks(), t.Model.Embed, t.Model.Head
	if mc.Llama != nil {
		if err := p.splitLlama(t, split); err != nil { // llama.go
			return err
		}
		blocks, embed, head = nil, nil, nil
	}
	for _, b := range blocks {
		ads := unwrapAdapters(b) // lora.go
		attn, proj, fc, mlp, err := denses(b)
		if err != nil {
			return err
		}
		if _, ok := b.Core.(*nn.CausalAttention); !ok {
			return fmt.Errorf("tp: %s's attention core is %T, not nn.CausalAttention; tensor parallel must prepare before plugins that replace it", b.Name(), b.Core)
		}
		type cut struct {
			w  **tensor.Tensor
			pl place.Placement
		}
		// The MLP's, and each expert's of a MoE block, alike: c_fc
		// column-parallel, c_proj row-parallel. A MoE block's router stays
		// whole: every rank routes the same tokens alike.
		mlpCuts := func(fcW, fcB, projW, projB **tensor.Tensor) []cut {
			return []cut{{fcW, cols(1, r*f, f)}, {fcB, cols(0, r*f, f)}, {projW, rows(r*f, f)}, {projB, place.Placement{}}}
		}
		ps := [8]*tensor.Tensor{attn.W, attn.B, proj.W, proj.B}
		cuts := []cut{{&ps[0], nn.QKVShard(1, C, H, h0, h1)}, {&ps[1], nn.QKVShard(0, C, H, h0, h1)},
			{&ps[2], rows(h0*hs, (h1-h0)*hs)}, {&ps[3], place.Placement{}}}
		if b.MoE == nil {
			ps[4], ps[5], ps[6], ps[7] = fc.W, fc.B, mlp.W, mlp.B
			cuts = append(cuts, mlpCuts(&ps[4], &ps[5], &ps[6], &ps[7])...)
		} else {
			for _, ex := range b.MoE.Experts {
				if ex != nil {
					cuts = append(cuts, mlpCuts(&ex.FcW, &ex.FcB, &ex.ProjW, &ex.ProjB)...)
				}
			}
		}
		for _, s := range cuts {
			if s.pl.Kind == place.Replicate {
				continue
			}
			if *s.w, err = split(b.Module, *s.w, s.pl); err != nil {
				return err
			}
		}
		b.Attn = &ColumnParallel{W: ps[0], B: ps[1], C: p.c, SP: p.SP}
		b.Core = &nn.CausalAttention{NHead: h1 - h0}
		b.AttnProj = &RowParallel{W: ps[2], B: ps[3], C: p.c, SP: p.SP}
		if b.MoE == nil {
			b.Fc = &ColumnParallel{W: ps[4], B: ps[5], C: p.c, SP: p.SP}
			b.MlpProj = &RowParallel{W: ps[6], B: ps[7], C: p.c, SP: p.SP}
		} else {
			for _, ex := range b.MoE.Experts {
				if ex != nil {
					ex.Fc = &ColumnParallel{W: ex.FcW, B: ex.FcB, C: p.c}
					ex.Proj = &RowParallel{W: ex.ProjW, B: ex.ProjB, C: p.c}
				}
			}
		}
		// The adapters' B follows a column-parallel base's output rows,
		// their A a row-parallel base's input columns (lora.go).
		type adapted struct {
			ads []*nn.Adapter
			pl  place.Placement
			dst *[]*nn.Adapter
		}
		adapt := []adapted{
			{ads[nn.SlotAttn], nn.QKVShard(0, C, H, h0, h1), &b.Attn.(*ColumnParallel).Adapters},
			{ads[nn.SlotAttnProj], cols(1, h0*hs, (h1-h0)*hs), &b.AttnProj.(*RowParallel).Adapters},
		}
		if b.MoE == nil { // adapters on MoE blocks are refused by the config
			adapt = append(adapt, adapted{ads[nn.SlotFc], rows(r*f, f), &b.Fc.(*ColumnParallel).Adapters},
				adapted{ads[nn.SlotMlpProj], cols(1, r*f, f), &b.MlpProj.(*RowParallel).Adapters})
		}
		for _, s := range adapt {
			for _, a := range s.ads {
				w := &a.B
				if s.pl.Dim == 1 {
					w, a.Col0 = &a.A, s.pl.Offset
				}
				if *w, err = split(b.Module, *w, s.pl); err != nil {
					return err
				}
			}
			*s.dst = s.ads
		}
		if p.SP {
			b.Norm1 = &LayerNorm{W: b.Ln1W, B: b.Ln1B, C: p.c}
			b.Norm2 = &LayerNorm{W: b.Ln2W, B: b.Ln2B, C: p.c}
		}
	}
	v0, v1 := VocabRange(mc.VocabSize, n, r)
	var wte *tensor.Tensor
	if e := embed; e != nil {
		var err error
		if wte, err = split(e.Module, e.Wte, rows(v0, v1-v0)); err != nil {
			return err
		}
		e.Wte = wte
		e.Layer = &VocabEmbedding{Wte: wte, Wpe: e.Wpe, Lo: v0, C: p.c, SP: p.SP}
	}
	if h := head; h != nil {
		if wte == nil {
			// A pipeline's last stage holds its own copy of the table.
			var err error
			if wte, err = split(h.Module, h.Wte, rows(v0, v1-v0)); err != nil {
				return err
			}
		}
		h.Wte = wte
		h.Out = &VocabHead{Wte: wte, Lo: v0, V: mc.VocabSize, C: p.c, SP: p.SP}
		if p.SP {
			h.Norm = &LayerNorm{W: h.LnW, B: h.LnB, C: p.c}
		}
	}
	if p.SP {
		t.SeqParts *= n
	}
	if t.Opt != nil {
		for _, s := range t.Opt.State() {
			s.Release()
		}
		t.Opt = trainer.BuildOptimizer(t.Cfg, t.Model.Params(), t.Alloc)
	}
	for _, q := range released {
		q.Release()
		if q.Grad != nil {
			q.Grad.Release()
		}
	}
	return nil
}

// denses returns a block's four linear layers, which must still be the
// plain nn.Dense (the attention's only, in a MoE block).
func denses(b *nn.Block) (attn, proj, fc, mlp *nn.Dense, err error) {
	var out [4]*nn.Dense
	for i, l := range []struct {
		name string
		l    nn.Layer
	}{{"attn.c_attn", b.Attn}, {"attn.c_proj", b.AttnProj}, {"mlp.c_fc", b.Fc}, {"mlp.c_proj", b.MlpProj}} {
		if i >= 2 && b.MoE != nil {
			break // a MoE block's experts (Prepare)
		}
		d, ok := l.l.(*nn.Dense)
		if !ok {
			return nil, nil, nil, nil, fmt.Errorf("tp: %s.%s is %T, not nn.Dense; tensor parallel must prepare before plugins that replace layers", b.Name(), l.name, l.l)
		}
		out[i] = d
	}
	return out[0], out[1], out[2], out[3], nil
}

// shard registers, in place of q, this rank's part of it along the TP
// axis: a new parameter of the same name holding the elements pl selects
// (and its gradient's, if q has one), whose Spec says which they are.
func shard(a *tensor.Allocator, c place.Coord, mod *nn.Module, q *tensor.Tensor, pl place.Placement) (*tensor.Tensor, error) {
	spec := q.Spec.Clone()
	spec.Along[place.TP] = pl
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	cut := func(src *tensor.Tensor, cat tensor.Category) *tensor.Tensor {
		dst := a.New(cat, src.DType(), spec.LocalShape()...)
		if src.DType() == tensor.Float32 {
			place.Scatter(spec, c, src.F32(), dst.F32())
		} else {
			place.Scatter(spec, c, src.F64(), dst.F64())
		}
		dst.Name = q.Name
		return dst
	}
	var s *tensor.Tensor
	if q.HasStorage() {
		s = cut(q, tensor.Params)
	} else {
		// A described parameter (construction by placement): the trainer
		// allocates and fills this part once every plugin has placed it.
		s = a.NewShell(tensor.Params, q.DType(), spec.LocalShape()...)
		s.Name = q.Name
	}
	if q.NeedsGrad() { // a frozen base (LoRA) stays frozen
		s.RequiresGrad()
	}
	s.Spec = spec
	if q.Grad != nil {
		s.Grad = cut(q.Grad, tensor.Grads)
	}
	if err := mod.SetParam(s); err != nil {
		s.Release()
		return nil, err
	}
	return s, nil
}
