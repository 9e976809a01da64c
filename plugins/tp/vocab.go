package tp

import (
	"fmt"
	"math"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
)

// VocabRange is the rows [lo, hi) of a vocabulary of v tokens that rank r
// of n holds: consecutive parts whose sizes differ by at most one, so a
// vocabulary that does not divide by n needs no padding rows at all (the
// limit of "padding that can never win": there is none to win). The
// parameter is exactly the held rows of the real table, which keeps
// checkpoints, ZeRO's flat buffers and place.Spec free of special cases.
func VocabRange(v, n, r int) (lo, hi int) {
	return r * v / n, (r + 1) * v / n
}

// VocabEmbedding is the input layer with the token table split by rows:
// Wte [hi-lo, C] holds tokens [Lo, Lo+rows). Each rank looks up the tokens
// it holds (zero rows for the others), the ranks' lookups are summed
// (Reduce) or, under sequence parallelism, summed and scattered along the
// sequence (ScatterSeq), and the position embedding Wpe (whole on every
// rank) is added to the rows this rank then holds. Under sequence
// parallelism those are its part of the sequence, so Wpe's gradient is a
// partial sum, summed over the group in backward. A Llama has no Wpe (nil).
type VocabEmbedding struct {
	Wte, Wpe *tensor.Tensor
	Lo       int
	C        *Comm
	SP       bool
}

// Forward implements nn.Layer on token ids idx [B, T].
func (e *VocabEmbedding) Forward(idx *tensor.Tensor, p nn.Pass) (*tensor.Tensor, error) {
	x, err := tensor.Apply("tp.vocab_lookup", &lookupFn{e: e, idx: append([]int32(nil), idx.I32()...), shape: idx.Shape()}, e.Wte)
	if err != nil {
		return nil, err
	}
	if !e.SP {
		x, err = tensor.Apply("tp.reduce", &reduceFn{c: e.C, inPlace: true}, x)
		if err != nil || e.Wpe == nil {
			return x, err
		}
		return tensor.AddPositions(x, e.Wpe, p.Pos), nil
	}
	T := idx.Dim(-1)
	x, err = tensor.Apply("tp.scatter_seq", &scatterSeqFn{c: e.C, consume: true}, x)
	if err != nil || e.Wpe == nil { // Llama: positions enter through RoPE
		return x, err
	}
	n, r := e.C.G.Size(), e.C.G.Rank()
	Tl := T / n
	pos := make([]int, Tl)
	for i := range pos {
		pos[i] = r*Tl + i
		if p.Pos != nil {
			pos[i] = p.Pos[r*Tl+i]
		}
	}
	return tensor.Apply("tp.add_positions", &addPosFn{c: e.C, pos: pos}, x, e.Wpe)
}

// lookupFn is the masked lookup: out[b, t] = Wte[idx[b, t] - Lo] for the
// tokens this rank holds, zero for the others.
type lookupFn struct {
	e     *VocabEmbedding
	idx   []int32
	shape []int
}

func (f *lookupFn) Forward(_ *tensor.FuncCtx, in ...*tensor.Tensor) (*tensor.Tensor, error) {
	w := in[0]
	rows, C := w.Dim(0), w.Dim(1)
	out := f.e.C.alloc().New(tensor.Activations, w.DType(), append(append([]int(nil), f.shape...), C)...)
	for i, id := range f.idx {
		if l := int(id) - f.e.Lo; l >= 0 && l < rows {
			copyRange(out, i*C, w, l*C, C)
		}
	}
	if out.DType() == tensor.Float32 {
		tensor.ParamRound(w, out.F32()) // the rows of the table's copy under mixed precision
	}
	return out, nil
}

// Backward adds the rows of g into the table's gradient in place
// (GradInto), as the full embedding's backward does: no buffer the size
// of this rank's table exists beside its gradient.
func (f *lookupFn) Backward(ctx *tensor.FuncCtx, g *tensor.Tensor) ([]*tensor.Tensor, error) {
	w := f.e.Wte
	rows, C := w.Dim(0), w.Dim(1)
	var gw, ret *tensor.Tensor
	if ctx.Backprop != nil {
		gw, ret = ctx.Backprop.GradInto(w)
	} else {
		gw = backAlloc(ctx).New(tensor.Activations, g.DType(), rows, C)
		ret = gw
	}
	if g.DType() == tensor.Float32 {
		scatterRows(g.F32(), gw.F32(), f.idx, f.e.Lo, rows, C)
	} else {
		scatterRows(g.F64(), gw.F64(), f.idx, f.e.Lo, rows, C)
	}
	return []*tensor.Tensor{ret}, nil
}

// scatterRows adds g's row i into gw's row idx[i]-lo for the ids held, in
// token order (each thread owns a column range, as the full embedding's
// backward does, so the sums do not depend on the thread count).
func scatterRows[T cpu.Float](g, gw []T, idx []int32, lo, rows, C int) {
	cpu.ParallelFor(C, 16, func(c0, c1 int) {
		for i, id := range idx {
			l := int(id) - lo
			if l < 0 || l >= rows {
				continue
			}
			dst, src := gw[l*C+c0:l*C+c1], g[i*C+c0:i*C+c1]
			for c := range dst {
				dst[c] += src[c]
			}
		}
	})
}

// addPosFn adds Wpe's rows at pos to the rows of x [B, len(pos), C] in
// place (x is the output of a collective) and sums Wpe's gradient over the
// group in backward: each rank saw its part of the sequence.
type addPosFn struct {
	c    *Comm
	pos  []int
	rows int // of the table
}

func (f *addPosFn) Forward(_ *tensor.FuncCtx, in ...*tensor.Tensor) (*tensor.Tensor, error) {
	x, wpe := in[0], in[1]
	B, T, C, err := seqDims("add_positions", x)
	if err != nil {
		return nil, err
	}
	if T != len(f.pos) || wpe.Dim(1) != C {
		return nil, fmt.Errorf("tp: positions of %v with %d positions and a table %v", x.Shape(), len(f.pos), wpe.Shape())
	}
	f.rows = wpe.Dim(0)
	for _, q := range f.pos {
		if q < 0 || q >= wpe.Dim(0) {
			return nil, fmt.Errorf("tp: position %d exceeds the %d positions of the table (raise model.block_size)", q, wpe.Dim(0))
		}
	}
	table, pos := wpe, f.pos
	if a := f.c.alloc(); x.DType() == tensor.Float32 && a.Compute() != tensor.Float32 {
		// The rows at pos of the table's copy, in order (mixed precision).
		table, pos = a.NewUninit(tensor.Activations, tensor.Float32, T, C), nil
		defer table.Release()
		for t, q := range f.pos {
			copy(table.F32()[t*C:(t+1)*C], wpe.F32()[q*C:(q+1)*C])
		}
		tensor.ParamRound(wpe, table.F32())
	}
	for b := 0; b < B; b++ {
		for t := range f.pos {
			q, r := t, (b*T+t)*C
			if pos != nil {
				q = pos[t]
			}
			if x.DType() == tensor.Float32 {
				cpu.Axpy(float32(1), table.F32()[q*C:(q+1)*C], x.F32()[r:r+C])
			} else {
				cpu.Axpy(1.0, wpe.F64()[q*C:(q+1)*C], x.F64()[r:r+C])
			}
		}
	}
	return x.Reshape(x.Shape()...), nil
}

func (f *addPosFn) Backward(ctx *tensor.FuncCtx, g *tensor.Tensor) ([]*tensor.Tensor, error) {
	B, T, C, _ := seqDims("add_positions", g)
	a := backAlloc(ctx)
	gw := a.New(tensor.Activations, g.DType(), f.rows, C)
	for b := 0; b < B; b++ {
		for t, q := range f.pos {
			r := (b*T + t) * C
			if g.DType() == tensor.Float32 {
				cpu.Axpy(float32(1), g.F32()[r:r+C], gw.F32()[q*C:(q+1)*C])
			} else {
				cpu.Axpy(1.0, g.F64()[r:r+C], gw.F64()[q*C:(q+1)*C])
			}
		}
	}
	if err := f.c.reduceGrads(a, "wpe.grad", gw); err != nil {
		return nil, err
	}
	return []*tensor.Tensor{g, gw}, nil
}

// VocabHead is the output layer with the tied token table split by rows
// (the same tensor as VocabEmbedding.Wte): each rank computes the logits of
// the tokens it holds, [B, T, rows], from the whole final hidden state
// (Copy; under sequence parallelism GatherSeq of this rank's part), and
// the cross-entropy is reduced over the group from three numbers per row
// (the maximum, the sum of exponentials and the target's logit), so no rank
// ever holds the full logits.
type VocabHead struct {
	Wte *tensor.Tensor
	// Lo is the first token this rank holds; V the real vocabulary.
	Lo, V int
	C     *Comm
	SP    bool
}

// local returns this rank's logits [B, T, rows].
func (h *VocabHead) local(x *tensor.Tensor) (*tensor.Tensor, error) {
	var in *tensor.Tensor
	var err error
	if h.SP {
		in, err = h.C.GatherSeq(x)
	} else {
		in, err = h.C.Copy(x)
	}
	if err != nil {
		return nil, err
	}
	return tensor.MatMulT(in, h.Wte), nil
}

// Logits implements nn.HeadLoss: the full logits [B, T, V], all-gathered
// over the vocabulary (evaluation and sampling; training never builds them).
func (h *VocabHead) Logits(x *tensor.Tensor, _ nn.Pass) (*tensor.Tensor, error) {
	l, err := h.local(x)
	if err != nil {
		return nil, err
	}
	n := h.C.G.Size()
	widths := make([]int, n)
	for r := range widths {
		lo, hi := VocabRange(h.V, n, r)
		widths[r] = hi - lo
	}
	return h.C.GatherLast(l, widths)
}

// Loss implements nn.HeadLoss: the mean cross-entropy over the targets
// [B, T] that are not ignored (< 0), the same number on every rank.
func (h *VocabHead) Loss(x, targets *tensor.Tensor, _ nn.Pass) (*tensor.Tensor, error) {
	l, err := h.local(x)
	if err != nil {
		return nil, err
	}
	return CrossEntropy(h.C, l, targets, h.Lo, h.V)
}

// CrossEntropy is the vocabulary-parallel cross-entropy: logits [..., w]
// are this rank's columns [lo, lo+w) of logits over a vocabulary of v,
// targets (int32, one per row, global token ids; < 0 ignored) are the same
// on every rank. Per row it all-reduces the maximum, then the sum of
// exp(logit - max) and the target's logit (which only its holder
// contributes): loss = log Σ + max - logit[target]. The result is the
// mean over the rows that count, on every rank; the gradient of this
// rank's logits is (softmax - one-hot) of its columns, with no
// communication.
func CrossEntropy(c *Comm, logits, targets *tensor.Tensor, lo, v int) (*tensor.Tensor, error) {
	w := logits.Dim(-1)
	rows := logits.Numel() / max(1, w)
	if targets.DType() != tensor.Int32 || targets.Numel() != rows {
		return nil, fmt.Errorf("tp: cross-entropy of %v logits with targets %v", logits.Shape(), targets.Shape())
	}
	if lo < 0 || lo+w > v {
		return nil, fmt.Errorf("tp: cross-entropy over columns [%d, %d) of a vocabulary of %d", lo, lo+w, v)
	}
	for i, y := range targets.I32() {
		if int(y) >= v {
			return nil, fmt.Errorf("tp: target %d at position %d is outside the vocabulary of %d", y, i, v)
		}
	}
	// Under mixed precision, as in tensor.CrossEntropy: the logits are
	// rounded to the compute dtype, the loss computed from them in
	// float32, and the backward keeps them in 2 bytes with each row's
	// maximum and sum instead of the probabilities, which it forms again.
	half := logits.DType() == tensor.Float32 && c.alloc().Compute() != tensor.Float32
	if half {
		tensor.RoundHalf(logits)
	}
	out, err := tensor.Apply("tp.cross_entropy", &crossEntropyFn{c: c, lo: lo, targets: append([]int32(nil), targets.I32()...), half: half}, logits)
	if err == nil && half {
		tensor.StoreHalf(out, logits)
	}
	return out, err
}

type crossEntropyFn struct {
	c       *Comm
	lo      int
	targets []int32
	count   int
	half    bool // keep the logits and the rows' statistics, not the probabilities
}

func (f *crossEntropyFn) Forward(ctx *tensor.FuncCtx, in ...*tensor.Tensor) (*tensor.Tensor, error) {
	logits := in[0]
	if logits.DType() == tensor.Float32 {
		return crossEntropyForward[float32](f, ctx, logits)
	}
	return crossEntropyForward[float64](f, ctx, logits)
}

func crossEntropyForward[T cpu.Float](f *crossEntropyFn, ctx *tensor.FuncCtx, logits *tensor.Tensor) (*tensor.Tensor, error) {
	a := f.c.alloc()
	w := logits.Dim(-1)
	rows := logits.Numel() / max(1, w)
	l := floats[T](logits)
	// The maximum of each row over the whole vocabulary.
	mx := a.NewUninit(tensor.Comm, logits.DType(), rows)
	defer mx.Release()
	m := floats[T](mx)
	cpu.ParallelFor(rows, max(1, 4096/max(w, 1)), func(r0, r1 int) {
		for r := r0; r < r1; r++ {
			best := T(math.Inf(-1))
			for _, x := range l[r*w : (r+1)*w] {
				best = max(best, x)
			}
			m[r] = best
		}
	})
	if err := f.c.run("all_reduce cross_entropy.max", mx.Bytes(), func() error { return f.c.G.AllReduce(mx, comm.Max) }); err != nil {
		return nil, err
	}
	// exp(logit - max) of this rank's columns (kept: the softmax once
	// divided; not formed under mixed precision, whose backward forms
	// them again), their sums and the target logits, summed over the
	// group.
	var probs *tensor.Tensor
	var p []T
	if !f.half {
		probs = a.NewUninit(tensor.Activations, logits.DType(), logits.Shape()...)
		p = floats[T](probs)
	}
	st := a.New(tensor.Comm, logits.DType(), 2*rows)
	defer st.Release()
	s := floats[T](st)
	cpu.ParallelFor(rows, max(1, 4096/max(w, 1)), func(r0, r1 int) {
		for r := r0; r < r1; r++ {
			var sum float64
			for i, x := range l[r*w : (r+1)*w] {
				e := math.Exp(float64(x - m[r]))
				if p != nil {
					p[r*w+i] = T(e)
				}
				sum += e
			}
			s[r] = T(sum)
			if k := int(f.targets[r]) - f.lo; f.targets[r] >= 0 && k >= 0 && k < w {
				s[rows+r] = l[r*w+k]
			}
		}
	})
	if err := f.c.run("all_reduce cross_entropy.sum_target", st.Bytes(), func() error { return f.c.G.AllReduce(st, comm.Sum) }); err != nil {
		if probs != nil {
			probs.Release()
		}
		return nil, err
	}
	var total float64
	for r := 0; r < rows; r++ {
		if f.targets[r] < 0 {
			continue
		}
		f.count++
		total += math.Log(float64(s[r])) + float64(m[r]) - float64(s[rows+r])
	}
	if f.half {
		// The rows' maximum and sum, float32, for the backward.
		ms := a.NewUninit(tensor.Activations, logits.DType(), 2*rows)
		copy(floats[T](ms), m)
		copy(floats[T](ms)[rows:], s[:rows])
		ctx.Save(logits, ms)
		ctx.Own(ms)
		ctx.ReadsHalf() // the logits as stored: no widened copy beside gl
	} else {
		cpu.ParallelFor(rows, max(1, 4096/max(w, 1)), func(r0, r1 int) {
			for r := r0; r < r1; r++ {
				inv := 1 / s[r]
				for i := range p[r*w : (r+1)*w] {
					p[r*w+i] *= inv
				}
			}
		})
		ctx.Save(probs)
		ctx.Own(probs)
	}
	out := a.New(tensor.Activations, logits.DType(), 1)
	out.Set(0, total/math.Max(1, float64(f.count)))
	return out, nil
}

func (f *crossEntropyFn) Backward(ctx *tensor.FuncCtx, g *tensor.Tensor) ([]*tensor.Tensor, error) {
	probs := ctx.Saved()[0]
	w := probs.Dim(-1)
	rows := probs.Numel() / max(1, w)
	d := g.At(0) / math.Max(1, float64(f.count))
	gl := backAlloc(ctx).NewUninit(tensor.Activations, probs.DType(), probs.Shape()...)
	if f.half {
		// The forward's probabilities again, bitwise, from the logits
		// widened and the rows' statistics, written into gl: the logits
		// are widened into gl itself and replaced there, in place.
		ms, p := ctx.Saved()[1].F32(), gl.F32()
		l := probs.F32()
		if h, dt := probs.StoredHalf(); h != nil {
			cpu.ParallelFor(len(h), 1<<16, func(lo, hi int) { tensor.WidenHalf(dt, p[lo:hi], h[lo:hi]) })
			l = p
		}
		cpu.ParallelFor(rows, max(1, 4096/max(w, 1)), func(r0, r1 int) {
			for r := r0; r < r1; r++ {
				inv := 1 / ms[rows+r]
				for i, x := range l[r*w : (r+1)*w] {
					p[r*w+i] = float32(math.Exp(float64(x-ms[r]))) * inv
				}
			}
		})
		crossEntropyBackward(p, p, f.targets, f.lo, rows, w, float32(d))
	} else if probs.DType() == tensor.Float32 {
		crossEntropyBackward(probs.F32(), gl.F32(), f.targets, f.lo, rows, w, float32(d))
	} else {
		crossEntropyBackward(probs.F64(), gl.F64(), f.targets, f.lo, rows, w, d)
	}
	return []*tensor.Tensor{gl}, nil
}

func crossEntropyBackward[T cpu.Float](p, gl []T, targets []int32, lo, rows, w int, d T) {
	cpu.ParallelFor(rows, max(1, 4096/max(w, 1)), func(r0, r1 int) {
		for r := r0; r < r1; r++ {
			dr := gl[r*w : (r+1)*w]
			if targets[r] < 0 {
				clear(dr)
				continue
			}
			for i, x := range p[r*w : (r+1)*w] {
				dr[i] = x * d
			}
			if k := int(targets[r]) - lo; k >= 0 && k < w {
				dr[k] -= d
			}
		}
	})
}
