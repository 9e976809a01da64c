package cpu

import "math"

// SumSquares returns the sum of x[i]^2, accumulated in float64 so the
// global gradient norm used for clipping does not lose the small tensors'
// contributions next to the large ones. Summed in fixed blocks, so the
// result does not depend on the thread count.
func SumSquares[T Float](x []T) float64 {
	const blk = 1 << 14
	nblk := (len(x) + blk - 1) / blk
	if nblk == 0 {
		return 0
	}
	part := make([]float64, nblk)
	ParallelFor(nblk, 4, func(lo, hi int) {
		for b := lo; b < hi; b++ {
			var s0, s1, s2, s3 float64
			xs := x[b*blk : min(len(x), (b+1)*blk)]
			for len(xs) >= 4 {
				v0, v1, v2, v3 := float64(xs[0]), float64(xs[1]), float64(xs[2]), float64(xs[3])
				s0 += v0 * v0
				s1 += v1 * v1
				s2 += v2 * v2
				s3 += v3 * v3
				xs = xs[4:]
			}
			for _, v := range xs {
				s0 += float64(v) * float64(v)
			}
			part[b] = (s0 + s1) + (s2 + s3)
		}
	})
	var s float64
	for _, p := range part {
		s += p
	}
	return s
}

// Clear sets every element of x to zero, over the kernels' threads for
// long slices: the gradients the trainer clears after every step and the
// zeroed buffers ops accumulate into run to megabytes, which one core
// clears at a fraction of the memory's bandwidth.
func Clear[T any](x []T) {
	ParallelFor(len(x), 16*elemGrain, func(lo, hi int) { clear(x[lo:hi]) })
}

// Scale multiplies x by s in place.
func Scale[T Float](x []T, s T) {
	ParallelFor(len(x), 4*elemGrain, func(lo, hi int) {
		for i := range x[lo:hi] {
			x[lo+i] *= s
		}
	})
}

// Axpy adds a*x to y (y has at least len(x) elements).
func Axpy[T Float](a T, x, y []T) {
	checkLen("Axpy", len(x), len(y))
	ParallelFor(len(x), 4*elemGrain, func(lo, hi int) {
		if isF32[T]() { // the same loop, vectorised C in the cgo build
			axpy32(float32(a), as32(x[lo:hi]), as32(y[lo:hi]))
			return
		}
		axpyGo(a, x[lo:hi], y[lo:hi])
	})
}

// axpyGo is Axpy on one chunk.
func axpyGo[T Float](a T, x, y []T) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] += a * v
	}
}

// Add writes z = x + y elementwise over len(z) elements; z may alias x or y.
func Add[T Float](x, y, z []T) {
	checkLen("Add", len(z), len(x), len(y))
	ParallelFor(len(z), 4*elemGrain, func(lo, hi int) {
		if isF32[T]() { // the same loop, vectorised C in the cgo build
			add32(as32(x[lo:hi]), as32(y[lo:hi]), as32(z[lo:hi]))
			return
		}
		addGo(x[lo:hi], y[lo:hi], z[lo:hi])
	})
}

// addGo is Add on one chunk.
func addGo[T Float](x, y, z []T) {
	x, y = x[:len(z)], y[:len(z)]
	for i := range z {
		z[i] = x[i] + y[i]
	}
}

// AddBias adds the bias b (length cols) to every row of the rows x cols
// matrix y.
func AddBias[T Float](y, b []T, rows, cols int) {
	checkRows("AddBias", rows, cols, []int{len(y)}, nil, []int{len(b)})
	if cols == 0 {
		return
	}
	ParallelFor(rows, max(1, elemGrain/cols), func(lo, hi int) {
		if isF32[T]() {
			addBias32(as32(y[lo*cols:hi*cols]), as32(b), cols)
			return
		}
		addBiasGo(y[lo*cols:hi*cols], b, cols)
	})
}

// addBiasGo adds b to each of the len(y)/cols rows of y (the cgo build runs
// the same loop in C for float32).
func addBiasGo[T Float](y, b []T, cols int) {
	b = b[:cols]
	for r := 0; r+cols <= len(y); r += cols {
		yr := y[r : r+cols]
		for i, v := range b {
			yr[i] += v
		}
	}
}

// colSumsGo adds the column sums of the len(dy)/cols rows of dy to p, rows
// in order (the cgo build runs the same loop in C for float32).
func colSumsGo[T Float](dy, p []T, cols int) {
	p = p[:cols]
	for r := 0; r+cols <= len(dy); r += cols {
		for i, v := range dy[r : r+cols] {
			p[i] += v
		}
	}
}

// BiasGrad accumulates db += the column sums of the rows x cols matrix dy.
// Rows are summed in fixed blocks combined in order (as in
// LayerNormBackward), so db does not depend on the thread count.
func BiasGrad[T Float](dy, db []T, rows, cols int) {
	checkRows("BiasGrad", rows, cols, []int{len(dy)}, nil, []int{len(db)})
	if rows == 0 || cols == 0 {
		return
	}
	nblk := (rows + rowBlock - 1) / rowBlock
	part := getBuf[T](nblk * cols)
	defer putBuf(part)
	ParallelFor(nblk, max(1, 2*elemGrain/(rowBlock*cols)), func(lo, hi int) {
		for blk := lo; blk < hi; blk++ {
			p := (*part)[blk*cols : (blk+1)*cols]
			clear(p)
			rs := dy[blk*rowBlock*cols : min(rows, (blk+1)*rowBlock)*cols]
			if isF32[T]() {
				colSums32(as32(rs), as32(p), cols)
			} else {
				colSumsGo(rs, p, cols)
			}
		}
	})
	sumBlocks(*part, nblk, cols, db)
}

// AdamW performs one step of AdamW with decoupled weight decay, matching
// torch.optim.AdamW (no amsgrad) exactly, t being the 1-based step count:
//
//	p *= 1 - lr*wd
//	m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g
//	p -= (lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps),  bc = 1 - b^t.
//
// The scalars are formed in float64 and then rounded to T, as PyTorch
// forms them from Python floats, and each element follows PyTorch's
// order of rounding steps, so float32 results match torch 1.13 bitwise
// (checked on 100k parameters over 3 steps).
func AdamW[T Float](p, g, m, v []T, lr, beta1, beta2, eps, wd float64, t int) {
	AdamWScaled(p, g, m, v, 1, lr, beta1, beta2, eps, wd, t)
}

// AdamWScaled is AdamW on the gradient g multiplied by gscale (rounded to
// T) as the update reads it, g itself left as it is: bitwise AdamW after
// Scale(g, T(gscale)), without that pass over g. The trainer's unscaling
// (fp16 loss scaling) and gradient clipping take this way.
func AdamWScaled[T Float](p, g, m, v []T, gscale, lr, beta1, beta2, eps, wd float64, t int) {
	checkLen("AdamW", len(p), len(g), len(m), len(v))
	bc1 := 1 - math.Pow(beta1, float64(t))
	bc2 := 1 - math.Pow(beta2, float64(t))
	var (
		decay   = T(1 - lr*wd)
		b1, b2  = T(beta1), T(beta2)
		ob1     = T(1 - beta1)
		ob2     = T(1 - beta2)
		step    = T(lr / bc1)
		bc2Sqrt = T(math.Sqrt(bc2))
		epsT    = T(eps)
		gs      = T(gscale)
	)
	ParallelFor(len(p), elemGrain, func(lo, hi int) {
		ps, gc, ms, vs := p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi]
		if isF32[T]() { // the same loop, vectorised C in the cgo build
			adamW32(as32(ps), as32(gc), as32(ms), as32(vs), float32(gs), float32(decay), float32(b1), float32(b2),
				float32(ob1), float32(ob2), float32(step), float32(bc2Sqrt), float32(epsT))
			return
		}
		adamWGo(ps, gc, ms, vs, gs, decay, b1, b2, ob1, ob2, step, bc2Sqrt, epsT)
	})
}

// adamWGo is AdamW's update of one chunk, on the gradient times gscale.
func adamWGo[T Float](ps, gs, ms, vs []T, gscale, decay, b1, b2, ob1, ob2, step, bc2Sqrt, epsT T) {
	for i, gi := range gs {
		gi *= gscale
		pi := ps[i] * decay
		// PyTorch's vectorised CPU kernels form m and v with fused
		// multiply-adds; for float32 the float64 FMAs here round the
		// same way except in vanishingly rare double-rounding cases.
		mi := T(math.FMA(float64(gi), float64(ob1), float64(b1*ms[i])))
		vi := T(math.FMA(float64(ob2*gi), float64(gi), float64(b2*vs[i])))
		ms[i], vs[i] = mi, vi
		ps[i] = pi - step*mi/(T(math.Sqrt(float64(vi)))/bc2Sqrt+epsT)
	}
}
