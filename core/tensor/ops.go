package tensor

import (
	"fmt"
	"math"
	"slices"

	"github.com/tinyacc/tinyacc/core/tensor/cpu"
)

// The ops below are written once as generic functions over float32 and
// float64 (float64 exists for finite-difference checks) and dispatched on the
// dtype of their first input. Each records its backward with record().

// data returns t's storage as []T (for float32, leaving a copy made as
// it was written alone: an op writes only its own output).
func data[T cpu.Float](t *Tensor) []T {
	var z T
	switch any(z).(type) {
	case float32:
		return any(t.f32s()).([]T)
	case float64:
		return any(t.F64()).([]T)
	}
	panic("tensor: unsupported element type")
}

// like allocates an uninitialised activation of t's dtype.
func like(t *Tensor, shape ...int) *Tensor {
	a := t.home
	if a == nil {
		a = Default
	}
	return a.NewUninit(Activations, t.dtype, shape...)
}

// zerosLike allocates a zeroed activation.
func zerosLike(t *Tensor, shape ...int) *Tensor {
	a := t.home
	if a == nil {
		a = Default
	}
	return a.New(Activations, t.dtype, shape...)
}

func checkFloat(op string, ts ...*Tensor) {
	dt := ts[0].dtype
	for _, t := range ts {
		if t == nil {
			continue
		}
		if t.dtype != Float32 && t.dtype != Float64 {
			panic(fmt.Sprintf("tensor: %s needs float32 or float64, got %s", op, t))
		}
		if t.dtype != dt {
			panic(fmt.Sprintf("tensor: %s mixes %s and %s", op, ts[0], t))
		}
	}
}

// addInto computes dst += src.
func addInto(dst, src *Tensor) {
	if dst.Numel() != src.Numel() {
		panic(fmt.Sprintf("tensor: gradient %s does not match %s", src, dst))
	}
	if dst.dtype == Float32 {
		cpu.Axpy(float32(1), src.f32, dst.f32)
	} else {
		cpu.Axpy(1.0, src.f64, dst.f64)
	}
}

// Add returns a + b (same shape).
func Add(a, b *Tensor) *Tensor {
	checkFloat("Add", a, b)
	if !slices.Equal(a.shape, b.shape) {
		panic(fmt.Sprintf("tensor: Add of %v and %v", a.shape, b.shape))
	}
	out := like(a, a.shape...)
	if a.dtype == Float32 {
		cpu.Add(a.f32, b.f32, out.f32)
	} else {
		cpu.Add(a.f64, b.f64, out.f64)
	}
	record(out, "add", func(_ *Backprop, g *Tensor) []*Tensor { return []*Tensor{g, g} }, a, b)
	outUnread(out)
	return out
}

// Scale returns s·x.
func Scale(x *Tensor, s float64) *Tensor {
	checkFloat("Scale", x)
	out := like(x, x.shape...)
	out.CopyFrom(x)
	scaleInPlace(out, s)
	record(out, "scale", func(_ *Backprop, g *Tensor) []*Tensor {
		gx := like(g, g.shape...)
		gx.CopyFrom(g)
		scaleInPlace(gx, s)
		return []*Tensor{gx}
	}, x)
	return out
}

func scaleInPlace(t *Tensor, s float64) {
	if t.dtype == Float32 {
		cpu.Scale(t.f32, float32(s))
	} else {
		cpu.Scale(t.f64, s)
	}
}

// Sum returns the sum of all elements as a one-element tensor.
func Sum(x *Tensor) *Tensor {
	checkFloat("Sum", x)
	out := like(x, 1)
	var s float64
	for i := 0; i < x.Numel(); i++ {
		s += x.At(i)
	}
	out.Set(0, s)
	record(out, "sum", func(_ *Backprop, g *Tensor) []*Tensor {
		gx := like(x, x.shape...)
		v := g.At(0)
		for i := 0; i < gx.Numel(); i++ {
			gx.Set(i, v)
		}
		return []*Tensor{gx}
	}, x)
	return out
}

// Mul returns the elementwise product a·b (same shape).
func Mul(a, b *Tensor) *Tensor {
	checkFloat("Mul", a, b)
	if !slices.Equal(a.shape, b.shape) {
		panic(fmt.Sprintf("tensor: Mul of %v and %v", a.shape, b.shape))
	}
	out := like(a, a.shape...)
	n := a.Numel()
	for i := 0; i < n; i++ {
		out.Set(i, a.At(i)*b.At(i))
	}
	record(out, "mul", func(_ *Backprop, g *Tensor) []*Tensor {
		ga, gb := like(a, a.shape...), like(b, b.shape...)
		for i := 0; i < n; i++ {
			ga.Set(i, g.At(i)*b.At(i))
			gb.Set(i, g.At(i)*a.At(i))
		}
		return []*Tensor{ga, gb}
	}, a, b)
	return out
}

// Dropout returns x with the elements drop selects (by row and column of
// the last dimension) zeroed and the others scaled by 1/(1-p); the
// gradient is masked and scaled alike. drop decides each element once, in
// the forward.
func Dropout(x *Tensor, p float64, drop func(row, col int) bool) *Tensor {
	checkFloat("Dropout", x)
	k := x.Dim(-1)
	rows := x.Numel() / max(1, k)
	keep := make([]bool, rows*k)
	out := like(x, x.shape...)
	s := 1 / (1 - p)
	for r := 0; r < rows; r++ {
		for c := 0; c < k; c++ {
			i := r*k + c
			keep[i] = !drop(r, c)
			if keep[i] {
				out.Set(i, s*x.At(i))
			} else {
				out.Set(i, 0)
			}
		}
	}
	record(out, "dropout", func(_ *Backprop, g *Tensor) []*Tensor {
		gx := like(x, x.shape...)
		for i, kept := range keep {
			if kept {
				gx.Set(i, s*g.At(i))
			} else {
				gx.Set(i, 0)
			}
		}
		return []*Tensor{gx}
	}, x)
	return out
}

// View returns x with a new shape of the same size, sharing storage; the
// gradient flows through unchanged.
func View(x *Tensor, shape ...int) *Tensor {
	out := x.Reshape(shape...)
	record(out, "view", func(_ *Backprop, g *Tensor) []*Tensor {
		return []*Tensor{g.Reshape(x.shape...)}
	}, x)
	return out
}

// Hook returns a tensor equal to x (sharing storage) whose backward calls fn
// when x's gradient arrives, before the ops that produced x run their
// backward. Module hooks are built on it.
func Hook(x *Tensor, name string, fn func(b *Backprop)) *Tensor {
	out := x.Reshape(x.shape...)
	record(out, "hook:"+name, func(b *Backprop, g *Tensor) []*Tensor {
		fn(b)
		return []*Tensor{g}
	}, x)
	return out
}

// Embedding returns w[idx] for token ids idx of any shape; the result has
// shape idx.shape + [C] for w of shape [V, C].
func Embedding(w, idx *Tensor) *Tensor {
	checkFloat("Embedding", w)
	if idx.dtype != Int32 || len(w.shape) != 2 {
		panic(fmt.Sprintf("tensor: Embedding(%s, %s) needs a [V,C] table and int32 ids", w, idx))
	}
	V, C := w.shape[0], w.shape[1]
	for i, id := range idx.i32 {
		if id < 0 || int(id) >= V {
			panic(fmt.Sprintf("tensor: token id %d at position %d is outside the vocabulary of %d", id, i, V))
		}
	}
	out := like(w, append(clone(idx.shape), C)...)
	if w.dtype == Float32 {
		embedFwd(w.f32, idx.i32, out.f32, C)
		ParamRound(w, out.f32) // the rows of the table's copy (precision.go)
	} else {
		embedFwd(w.f64, idx.i32, out.f64, C)
	}
	record(out, "embedding", func(bp *Backprop, g *Tensor) []*Tensor {
		gw, _, ret := gradBuffer(bp, w)
		if w.dtype == Float32 {
			embedBwd(g.f32, idx.i32, gw.f32, C)
		} else {
			embedBwd(g.f64, idx.i32, gw.f64, C)
		}
		return []*Tensor{ret}
	}, w)
	return out
}

func embedFwd[T cpu.Float](w []T, idx []int32, out []T, C int) {
	cpu.ParallelFor(len(idx), 64, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			copy(out[i*C:(i+1)*C], w[int(idx[i])*C:(int(idx[i])+1)*C])
		}
	})
}

// embedBwd scatters gradients into rows of gw. Each thread owns a column
// range, so repeated ids add in token order whatever the thread count.
func embedBwd[T cpu.Float](g []T, idx []int32, gw []T, C int) {
	cpu.ParallelFor(C, 16, func(lo, hi int) {
		for i, id := range idx {
			dst := gw[int(id)*C+lo : int(id)*C+hi]
			src := g[i*C+lo : i*C+hi]
			for c := range dst {
				dst[c] += src[c]
			}
		}
	})
}

// AddPositions returns x + wpe[pos[t]] for x of shape [B, T, C]: pos holds
// the global position of each of x's T rows (nil means 0..T-1). A rank
// holding a part of the sequence (context parallel, a zigzag split's two
// chunks) passes the positions of its rows.
func AddPositions(x, wpe *Tensor, pos []int) *Tensor {
	checkFloat("AddPositions", x, wpe)
	if len(x.shape) != 3 || len(wpe.shape) != 2 || wpe.shape[1] != x.shape[2] {
		panic(fmt.Sprintf("tensor: AddPositions(%v, %v)", x.shape, wpe.shape))
	}
	B, T, C := x.shape[0], x.shape[1], x.shape[2]
	if pos != nil && len(pos) != T {
		panic(fmt.Sprintf("tensor: AddPositions of %d rows with %d positions", T, len(pos)))
	}
	for t := 0; t < T; t++ {
		if p := position(pos, t); p < 0 || p >= wpe.shape[0] {
			panic(fmt.Sprintf("tensor: position %d exceeds the %d positions of the table (raise model.block_size)", p, wpe.shape[0]))
		}
	}
	out := like(x, x.shape...)
	if x.dtype == Float32 && computeOf(wpe) != Float32 {
		// The rows at pos of the table's copy (precision.go), in order.
		rows := like(x, T, C)
		for t := 0; t < T; t++ {
			q := position(pos, t)
			copy(rows.f32[t*C:(t+1)*C], wpe.f32[q*C:(q+1)*C])
		}
		ParamRound(wpe, rows.f32)
		addPosFwd(x.f32, rows.f32, out.f32, nil, B, T, C)
		rows.Release()
	} else if x.dtype == Float32 {
		addPosFwd(x.f32, wpe.f32, out.f32, pos, B, T, C)
	} else {
		addPosFwd(x.f64, wpe.f64, out.f64, pos, B, T, C)
	}
	record(out, "add_positions", func(bp *Backprop, g *Tensor) []*Tensor {
		var gx, ret *Tensor
		if x.requiresGrad {
			gx = like(g, g.shape...)
			gx.CopyFrom(g)
		}
		if wpe.requiresGrad {
			var gw *Tensor
			gw, _, ret = gradBuffer(bp, wpe)
			if x.dtype == Float32 {
				addPosBwd(g.f32, gw.f32, pos, B, T, C)
			} else {
				addPosBwd(g.f64, gw.f64, pos, B, T, C)
			}
		}
		return []*Tensor{gx, ret}
	}, x, wpe)
	return out
}

// position is the global position of row t (pos nil: t itself).
func position(pos []int, t int) int {
	if pos == nil {
		return t
	}
	return pos[t]
}

func addPosFwd[T cpu.Float](x, p, out []T, pos []int, B, Tn, C int) {
	if pos == nil { // rows 0..T-1: one contiguous block of the table
		n := Tn * C
		for b := 0; b < B; b++ {
			cpu.Add(x[b*n:(b+1)*n], p[:n], out[b*n:(b+1)*n])
		}
		return
	}
	for b := 0; b < B; b++ {
		for t, q := range pos {
			r := (b*Tn + t) * C
			cpu.Add(x[r:r+C], p[q*C:(q+1)*C], out[r:r+C])
		}
	}
}

func addPosBwd[T cpu.Float](g, gp []T, pos []int, B, Tn, C int) {
	for b := 0; b < B; b++ {
		for t := 0; t < Tn; t++ {
			q := position(pos, t)
			r := (b*Tn + t) * C
			cpu.Axpy(T(1), g[r:r+C], gp[q*C:(q+1)*C])
		}
	}
}

// LayerNorm normalises over the last dimension and applies weight and bias.
func LayerNorm(x, w, b *Tensor, eps float64) *Tensor {
	checkFloat("LayerNorm", x, w, b)
	C := x.Dim(-1)
	if w.Numel() != C || b.Numel() != C {
		panic(fmt.Sprintf("tensor: LayerNorm of %v with weight %v and bias %v", x.shape, w.shape, b.shape))
	}
	rows := x.Numel() / C
	out := like(x, x.shape...)
	mean, rstd := like(x, rows), like(x, rows)
	var hx, hy *Tensor // the copies StoreHalf takes (early.go)
	if x.dtype == Float32 {
		wv, doneW := ReadParam(w) // the copies (precision.go)
		bv, doneB := ReadParam(b)
		hx, hy = earlyHalf(x, false), earlyHalf(out, x.requiresGrad || w.requiresGrad || b.requiresGrad)
		if hx == nil && hy == nil {
			cpu.LayerNormForward(x.f32, wv.f32, bv.f32, out.f32, mean.f32, rstd.f32, rows, C, float32(eps))
		} else {
			cpu.LayerNormForwardHalf(isF16(hx) || isF16(hy), x.f32, wv.f32, bv.f32, out.f32, mean.f32, rstd.f32, rows, C, float32(eps), halfBits(hx), halfBits(hy))
		}
		doneW()
		doneB()
	} else {
		cpu.LayerNormForward(x.f64, w.f64, b.f64, out.f64, mean.f64, rstd.f64, rows, C, eps)
	}
	record(out, "layernorm", func(bp *Backprop, g *Tensor) []*Tensor {
		gx := like(x, x.shape...) // written, not added to
		gw, _, retW := gradBuffer(bp, w)
		gb, _, retB := gradBuffer(bp, b)
		if x.dtype == Float32 {
			wv, done := ReadParam(w)
			if h := storedHalf(x); h != nil {
				cpu.LayerNormBackwardFreshHalf(h.dtype == Float16, g.f32, h.u16, wv.f32, mean.f32, rstd.f32, gx.f32, gw.f32, gb.f32, rows, C)
			} else {
				cpu.LayerNormBackwardFresh(g.f32, x.f32, wv.f32, mean.f32, rstd.f32, gx.f32, gw.f32, gb.f32, rows, C)
			}
			done()
		} else {
			cpu.LayerNormBackwardFresh(g.f64, x.f64, w.f64, mean.f64, rstd.f64, gx.f64, gw.f64, gb.f64, rows, C)
		}
		return []*Tensor{gx, retW, retB}
	}, x, w, b)
	saveBuf(out, mean, rstd)
	halfReads(out) // x, kept in 2 bytes, is widened a piece at a time in cache
	setRefill(out, func(out *Tensor) {
		// The same kernel on the same input: bitwise the dropped output
		// (and statistics equal to the kept ones, which are left alone).
		m, r := like(x, rows), like(x, rows)
		if x.dtype == Float32 {
			wv, doneW := ReadParam(w)
			bv, doneB := ReadParam(b)
			cpu.LayerNormForward(x.f32, wv.f32, bv.f32, out.f32, m.f32, r.f32, rows, C, float32(eps))
			doneW()
			doneB()
		} else {
			cpu.LayerNormForward(x.f64, w.f64, b.f64, out.f64, m.f64, r.f64, rows, C, eps)
		}
		m.Release()
		r.Release()
	})
	outUnread(out)
	keepEarly(x, hx)
	keepEarly(out, hy)
	return out
}

// setRefill lets Drop give out's storage back: refill forms it again.
func setRefill(out *Tensor, refill func(out *Tensor)) {
	if out.node != nil {
		out.node.refill = refill
	}
}

// outUnread records that out's backward reads its inputs but not out
// itself, so a backward that frees as it goes gives out's storage back
// once its consumers' backwards are done, before its own runs.
func outUnread(out *Tensor) {
	if out.node != nil {
		out.node.outUnread = true
	}
}

// halfReads records that out's backward reads its inputs kept in 2 bytes
// as stored (node.readsHalf): as operands of matrix products that round
// them to the compute dtype anyway (Linear, LinearT, MatMulT), or widened
// a piece at a time into cache as a kernel reads them (GELU, LayerNorm,
// RMSNorm, SwiGLU's gate).
func halfReads(out *Tensor) {
	if out.node != nil {
		out.node.readsHalf = true
	}
}

// Gelu applies the tanh approximation of GELU elementwise.
func Gelu(x *Tensor) *Tensor {
	checkFloat("Gelu", x)
	out := like(x, x.shape...)
	var hx, hy *Tensor // the copies StoreHalf takes (early.go)
	if x.dtype == Float32 {
		hx, hy = earlyHalf(x, false), earlyHalf(out, x.requiresGrad)
		if hx == nil && hy == nil {
			cpu.GeluForward(x.f32, out.f32)
		} else {
			cpu.GeluForwardHalf(isF16(hx) || isF16(hy), x.f32, out.f32, halfBits(hx), halfBits(hy))
		}
	} else {
		cpu.GeluForward(x.f64, out.f64)
	}
	record(out, "gelu", func(_ *Backprop, g *Tensor) []*Tensor {
		gx := like(x, x.shape...) // written, not added to
		if x.dtype == Float32 {
			if h := storedHalf(x); h != nil {
				cpu.GeluBackwardFreshHalf(h.dtype == Float16, h.u16, g.f32, gx.f32)
			} else {
				cpu.GeluBackwardFresh(x.f32, g.f32, gx.f32)
			}
		} else {
			cpu.GeluBackwardFresh(x.f64, g.f64, gx.f64)
		}
		return []*Tensor{gx}
	}, x)
	setRefill(out, func(out *Tensor) {
		if x.dtype == Float32 {
			cpu.GeluForward(x.f32, out.f32)
		} else {
			cpu.GeluForward(x.f64, out.f64)
		}
	})
	outUnread(out)
	halfReads(out) // x, kept in 2 bytes, is widened a piece at a time in cache
	keepEarly(x, hx)
	keepEarly(out, hy)
	return out
}

// CrossEntropy returns the mean over all positions of -log softmax(logits)
// at the target; logits are [..., V], targets int32 [...]. Targets < 0 are
// ignored (they count neither in the sum nor in the mean's denominator).
func CrossEntropy(logits, targets *Tensor) *Tensor {
	checkFloat("CrossEntropy", logits)
	V := logits.Dim(-1)
	rows := logits.Numel() / V
	if targets.dtype != Int32 || targets.Numel() != rows {
		panic(fmt.Sprintf("tensor: CrossEntropy of %s with targets %s", logits, targets))
	}
	count := 0
	for i, y := range targets.i32 {
		if int(y) >= V {
			panic(fmt.Sprintf("tensor: target %d at position %d is outside the vocabulary of %d", y, i, V))
		}
		if y >= 0 {
			count++
		}
	}
	// Under mixed precision the logits, a half product's output, are
	// rounded to the compute dtype as autocast's are, the softmax and the
	// loss computed from them in float32, and the backward keeps the
	// logits in 2 bytes instead of the probabilities in 4: it widens
	// them into the gradient's buffer and forms the probabilities again
	// there, in place, with the same kernel (node.readsHalf: no widened
	// logits beside the gradient). So neither pass holds a second
	// logits-sized float32 buffer beside the first.
	half := logits.dtype == Float32 && computeOf(logits) != Float32
	if half {
		// with the copy storeHalf takes below (early.go)
		done := StoringHalf(logits)
		RoundHalf(logits)
		done()
	}
	losses := like(logits, rows)
	var probs *Tensor
	switch {
	case half:
		// Only the losses: no probabilities beside the logits.
		cpu.CrossEntropyLosses(logits.f32, targets.i32, rows, V, losses.f32)
	case logits.dtype == Float32:
		probs = like(logits, logits.shape...)
		cpu.CrossEntropyForward(logits.f32, targets.i32, rows, V, probs.f32, losses.f32)
	default:
		probs = like(logits, logits.shape...)
		cpu.CrossEntropyForward(logits.f64, targets.i32, rows, V, probs.f64, losses.f64)
	}
	var sum float64
	for r := 0; r < rows; r++ {
		sum += losses.At(r)
	}
	out := like(logits, 1)
	out.Set(0, sum/math.Max(1, float64(count)))
	losses.Release()
	record(out, "cross_entropy", func(_ *Backprop, g *Tensor) []*Tensor {
		gl := like(logits, logits.shape...)
		dl := like(logits, rows)
		v := g.At(0) / math.Max(1, float64(count))
		for r := 0; r < rows; r++ {
			dl.Set(r, v)
		}
		if half {
			if h, d := logits.StoredHalf(); h != nil {
				convGrain(len(h), func(lo, hi int) { WidenHalf(d, gl.f32[lo:hi], h[lo:hi]) })
			} else {
				copy(gl.f32, logits.f32)
			}
			// in place; dl as scratch for the losses
			cpu.CrossEntropyForward(gl.f32, targets.i32, rows, V, gl.f32, dl.f32)
			for r := 0; r < rows; r++ {
				dl.Set(r, v)
			}
			cpu.CrossEntropyBackward(gl.f32, targets.i32, dl.f32, rows, V, gl.f32)
		} else if logits.dtype == Float32 {
			cpu.CrossEntropyBackward(probs.f32, targets.i32, dl.f32, rows, V, gl.f32)
		} else {
			cpu.CrossEntropyBackward(probs.f64, targets.i32, dl.f64, rows, V, gl.f64)
		}
		dl.Release()
		return []*Tensor{gl}
	}, logits)
	switch {
	case out.node != nil && half:
		storeHalf(logits) // precision.go
		out.node.readsHalf = true
	case out.node != nil:
		saveBuf(out, probs)
	case probs != nil:
		probs.Release()
	}
	return out
}
