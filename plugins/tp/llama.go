package tp

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// splitLlama is Prepare's split of a Llama (GPT-2's is in Prepare):
//
//	q_proj            column-parallel, the rows of this rank's query heads
//	k_proj, v_proj    column-parallel, the rows of this rank's key/value
//	                  heads (n_kv_head/tp of them, serving its query heads);
//	                  q, k and v run as one layer, the core on those heads
//	o_proj            row-parallel, the columns of this rank's query heads
//	gate_proj,        column-parallel, rows [r·I/tp, (r+1)·I/tp) of each,
//	up_proj           as one layer; the SwiGLU gate runs on this rank's part
//	down_proj         row-parallel, the same columns
//	embed_tokens,     rows [lo, hi) of the vocabulary (VocabRange): the
//	lm_head           embedding and the head become vocab-parallel, the
//	                  head's own table split like the embedding's
//	norms             under sequence parallelism: RMSNorms of this rank's
//	                  part of the sequence, their gradients summed
func (p *TP) splitLlama(t *trainer.Trainer, split func(*nn.Module, *tensor.Tensor, place.Placement) (*tensor.Tensor, error)) error {
	mc := t.Model.Config
	n, r := p.c.G.Size(), p.c.G.Rank()
	hs, eps := mc.HeadSize(), mc.Llama.NormEps
	h0, h1 := r*mc.NHead/n, (r+1)*mc.NHead/n
	g0, g1 := r*mc.KVHeads()/n, (r+1)*mc.KVHeads()/n
	f := mc.FFN() / n
	at := func(dim, lo, n int) place.Placement {
		return place.Placement{Kind: place.Shard, Dim: dim, Offset: lo, Length: n}
	}
	for _, b := range t.Model.Blocks() {
		ads := unwrapAdapters(b) // lora.go
		attn, ok1 := b.Attn.(*nn.DenseT)
		proj, ok2 := b.AttnProj.(*nn.DenseT)
		fc, ok3 := b.Fc.(*nn.DenseT)
		mlp, ok4 := b.MlpProj.(*nn.DenseT)
		core, ok5 := b.Core.(*nn.CausalAttention)
		if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 {
			return fmt.Errorf("tp: %s's layers are %T, %T, %T, %T and %T, not the plain Llama layers; tensor parallel must prepare before plugins that replace them",
				b.Name(), b.Attn, b.Core, b.AttnProj, b.Fc, b.MlpProj)
		}
		var ps [7]*tensor.Tensor
		for i, s := range []struct {
			w  *tensor.Tensor
			pl place.Placement
		}{
			{attn.Ws[0], at(0, h0*hs, (h1-h0)*hs)}, {attn.Ws[1], at(0, g0*hs, (g1-g0)*hs)}, {attn.Ws[2], at(0, g0*hs, (g1-g0)*hs)},
			{proj.Ws[0], at(1, h0*hs, (h1-h0)*hs)},
			{fc.Ws[0], at(0, r*f, f)}, {fc.Ws[1], at(0, r*f, f)}, {mlp.Ws[0], at(1, r*f, f)},
		} {
			var err error
			if ps[i], err = split(b.Module, s.w, s.pl); err != nil {
				return err
			}
		}
		b.Attn = &ColumnParallel{Ws: ps[0:3], C: p.c, SP: p.SP}
		b.Core = &nn.CausalAttention{NHead: h1 - h0, NKVHead: g1 - g0, RopeTheta: core.RopeTheta}
		b.AttnProj = &RowParallel{W: ps[3], C: p.c, SP: p.SP, T: true}
		b.Fc = &ColumnParallel{Ws: ps[4:6], C: p.c, SP: p.SP}
		b.MlpProj = &RowParallel{W: ps[6], C: p.c, SP: p.SP, T: true}
		// Adapters follow their weight: B the rows of a column-parallel
		// one (starting, in this rank's fused output, after the local
		// parts of the weights before it), A the columns of o_proj and
		// down_proj (lora.go).
		q, kv := mc.NHead*hs, mc.KVHeads()*hs
		qL, kvL := (h1-h0)*hs, (g1-g0)*hs
		type part struct {
			pl place.Placement
			lo int // local start of its columns
		}
		byLo := map[nn.Slot]map[int]part{
			nn.SlotAttn: {0: {at(0, h0*hs, qL), 0}, q: {at(0, g0*hs, kvL), qL}, q + kv: {at(0, g0*hs, kvL), qL + kvL}},
			nn.SlotFc:   {0: {at(0, r*f, f), 0}, mc.FFN(): {at(0, r*f, f), f}},
		}
		rowsIn := map[nn.Slot]place.Placement{nn.SlotAttnProj: at(1, h0*hs, qL), nn.SlotMlpProj: at(1, r*f, f)}
		for slot, l := range map[nn.Slot]*[]*nn.Adapter{nn.SlotAttn: &b.Attn.(*ColumnParallel).Adapters, nn.SlotAttnProj: &b.AttnProj.(*RowParallel).Adapters,
			nn.SlotFc: &b.Fc.(*ColumnParallel).Adapters, nn.SlotMlpProj: &b.MlpProj.(*RowParallel).Adapters} {
			for _, a := range ads[slot] {
				var err error
				if pl, ok := rowsIn[slot]; ok {
					a.A, err = split(b.Module, a.A, pl)
					a.Col0 = pl.Offset
				} else {
					pt := byLo[slot][a.Lo]
					a.B, err = split(b.Module, a.B, pt.pl)
					a.Lo = pt.lo
				}
				if err != nil {
					return err
				}
			}
			*l = ads[slot]
		}
		if p.SP {
			b.Norm1 = &RMSNorm{W: b.Ln1W, Eps: eps, C: p.c}
			b.Norm2 = &RMSNorm{W: b.Ln2W, Eps: eps, C: p.c}
		}
	}
	v0, v1 := VocabRange(mc.VocabSize, n, r)
	var table *tensor.Tensor
	if e := t.Model.Embed; e != nil {
		var err error
		if table, err = split(e.Module, e.Wte, at(0, v0, v1-v0)); err != nil {
			return err
		}
		e.Wte = table
		e.Layer = &VocabEmbedding{Wte: table, Lo: v0, C: p.c, SP: p.SP}
	}
	if h := t.Model.Head; h != nil {
		if table == nil || !mc.Llama.Tied {
			// An lm_head of its own, or a pipeline's last stage's copy of
			// the tied table.
			var err error
			if table, err = split(h.Module, h.Wte, at(0, v0, v1-v0)); err != nil {
				return err
			}
		}
		h.Wte = table
		h.Out = &VocabHead{Wte: table, Lo: v0, V: mc.VocabSize, C: p.c, SP: p.SP}
		if p.SP {
			h.Norm = &RMSNorm{W: h.LnW, Eps: eps, C: p.c}
		}
	}
	return nil
}

// RMSNorm is an RMSNorm under sequence parallelism: it normalises this
// rank's part of the sequence with the whole weight, which every rank
// holds, so the weight's gradient is a partial sum, summed over the group
// in backward (as LayerNorm's).
type RMSNorm struct {
	W   *tensor.Tensor
	Eps float64
	C   *Comm
}

// Forward implements nn.Layer.
func (l *RMSNorm) Forward(x *tensor.Tensor, _ nn.Pass) (*tensor.Tensor, error) {
	return tensor.Apply("tp.rmsnorm", &rmsNormFn{l: l}, x, l.W)
}

type rmsNormFn struct{ l *RMSNorm }

func (f *rmsNormFn) Forward(ctx *tensor.FuncCtx, in ...*tensor.Tensor) (*tensor.Tensor, error) {
	x, w := in[0], in[1]
	C := x.Dim(-1)
	if w.Numel() != C {
		return nil, fmt.Errorf("tp: RMSNorm of %v with weight %v", x.Shape(), w.Shape())
	}
	rows := x.Numel() / C
	a := f.l.C.alloc()
	y := a.NewUninit(tensor.Activations, x.DType(), x.Shape()...)
	rstd := a.NewUninit(tensor.Activations, x.DType(), rows)
	if x.DType() == tensor.Float32 {
		wv, done := tensor.ReadParam(w) // the weight's copy under mixed precision
		cpu.RMSNormForward(x.F32(), wv.F32(), y.F32(), rstd.F32(), rows, C, f.l.Eps)
		done()
	} else {
		cpu.RMSNormForward(x.F64(), w.F64(), y.F64(), rstd.F64(), rows, C, f.l.Eps)
	}
	ctx.Save(x, rstd)
	ctx.Own(rstd)
	return y, nil
}

func (f *rmsNormFn) Backward(ctx *tensor.FuncCtx, g *tensor.Tensor) ([]*tensor.Tensor, error) {
	s := ctx.Saved()
	x, rstd, w := s[0], s[1], f.l.W
	C := x.Dim(-1)
	rows := x.Numel() / C
	a := backAlloc(ctx)
	gx := a.New(tensor.Activations, x.DType(), x.Shape()...)
	gw := a.New(tensor.Activations, w.DType(), C)
	if x.DType() == tensor.Float32 {
		wv, done := tensor.ReadParam(w)
		cpu.RMSNormBackward(g.F32(), x.F32(), wv.F32(), rstd.F32(), gx.F32(), gw.F32(), rows, C)
		done()
	} else {
		cpu.RMSNormBackward(g.F64(), x.F64(), w.F64(), rstd.F64(), gx.F64(), gw.F64(), rows, C)
	}
	if err := f.l.C.reduceGrads(a, "rmsnorm.grad", gw); err != nil {
		return nil, err
	}
	return []*tensor.Tensor{gx, gw}, nil
}
