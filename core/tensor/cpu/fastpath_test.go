package cpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFastPathMatchesGo holds the float32 fast paths (vectorised C in the
// cgo build) to the Go loops bitwise, on inputs covering the clamps,
// infinities, a row shorter than the lane count and ragged tails.
func TestFastPathMatchesGo(t *testing.T) {
	rng := newRNG(61)
	x := randSlice[float32](rng, 100003, 12)
	x = append(x, 0, -0.0, 1e-30, -1e-30, 80, -80, 1e4, -1e4, float32(math.Inf(1)), float32(math.Inf(-1)))
	y1, y2 := make([]float32, len(x)), make([]float32, len(x))
	geluFwd32(x, y1)
	geluFwd32Go(x, y2)
	require.Equal(t, y2, y1, "gelu forward")

	dy := randSlice[float32](rng, len(x), 1)
	d1, d2 := randSlice[float32](rng, len(x), 1), make([]float32, len(x))
	copy(d2, d1)
	geluBwd32(x[:100003], dy, d1)
	geluBwd32Go(x[:100003], dy, d2)
	require.Equal(t, d2, d1, "gelu backward")

	for _, n := range []int{1, 5, 16, 17, 257} {
		rows := 7
		src := randSlice[float32](rng, rows*n, 30)
		src[0] = -200 // exp flushes to zero
		if n > 1 {    // a masked logit (a row of only -Inf is NaN, as in PyTorch)
			src[len(src)-1] = float32(math.Inf(-1))
		}
		p1, p2 := make([]float32, rows*n), make([]float32, rows*n)
		m1, s1 := make([]float32, rows), make([]float32, rows)
		m2, s2 := make([]float32, rows), make([]float32, rows)
		softmaxRows32(src, p1, rows, n, m1, s1)
		softmaxRows32Go(src, p2, rows, n, m2, s2)
		require.Equal(t, p2, p1, "softmax rows n=%d", n)
		require.Equal(t, m2, m1, "row maxima n=%d", n)
		require.Equal(t, s2, s1, "row sums n=%d", n)
	}

	// Rows of a 70-wide block softmaxed over prefixes of different lengths,
	// one of them empty, zeroed up to width 66.
	lens := []int64{1, 0, 17, 64, 66, 5}
	ld, width := 70, 66
	a1 := randSlice[float32](rng, len(lens)*ld, 5)
	a2 := append([]float32(nil), a1...)
	m1, s1 := make([]float32, len(lens)), make([]float32, len(lens))
	m2, s2 := make([]float32, len(lens)), make([]float32, len(lens))
	softmaxPrefix32(a1, ld, width, lens, m1, s1)
	softmaxPrefix32Go(a2, ld, width, lens, m2, s2)
	require.Equal(t, a2, a1, "prefix softmax")
	require.Equal(t, m2, m1, "prefix softmax maxima")
	require.Equal(t, s2, s1, "prefix softmax sums")
	require.Equal(t, float32(math.Inf(-1)), m1[1], "maximum of an empty row")
	for r, n := range lens {
		var sum float64
		for i, x := range a1[r*ld : r*ld+ld] {
			switch {
			case i < int(n):
				sum += float64(x)
			case i < width:
				require.Zero(t, x, "row %d entry %d past the prefix", r, i)
			}
		}
		if n > 0 {
			require.InDelta(t, 1, sum, 1e-6, "row %d sums to one", r)
		}
	}
}

func TestLayerNormFastPathMatchesGo(t *testing.T) {
	rng := newRNG(63)
	for _, cols := range []int{1, 7, 16, 256, 301} {
		rows := 5
		x := randSlice[float32](rng, rows*cols, 3)
		w, b := randSlice[float32](rng, cols, 1), randSlice[float32](rng, cols, 1)
		y1, y2 := make([]float32, rows*cols), make([]float32, rows*cols)
		m1, r1 := make([]float32, rows), make([]float32, rows)
		m2, r2 := make([]float32, rows), make([]float32, rows)
		layerNormFwd32(x, w, b, y1, m1, r1, cols, 1e-5)
		layerNormFwdGo(x, w, b, y2, m2, r2, cols, 1e-5)
		require.Equal(t, y2, y1, "y cols=%d", cols)
		require.Equal(t, m2, m1, "mean cols=%d", cols)
		require.Equal(t, r2, r1, "rstd cols=%d", cols)

		dy := randSlice[float32](rng, rows*cols, 1)
		dx1, pw1, pb1 := randSlice[float32](rng, rows*cols, 1), randSlice[float32](rng, cols, 1), randSlice[float32](rng, cols, 1)
		dx2 := append([]float32(nil), dx1...)
		pw2, pb2 := append([]float32(nil), pw1...), append([]float32(nil), pb1...)
		layerNormBwd32(dy, x, w, m1, r1, dx1, pw1, pb1, cols)
		layerNormBwdGo(dy, x, w, m1, r1, dx2, pw2, pb2, cols, false)
		require.Equal(t, dx2, dx1, "dx cols=%d", cols)
		require.Equal(t, pw2, pw1, "dw partial cols=%d", cols)
		require.Equal(t, pb2, pb1, "db partial cols=%d", cols)
	}
}

// TestExpMinusFastPathMatchesGo: the attention backward's exp(x - lse),
// flushed below the smallest normal and clamped above, bitwise as in Go.
func TestExpMinusFastPathMatchesGo(t *testing.T) {
	rng := newRNG(65)
	x := randSlice[float32](rng, 1003, 60)
	x = append(x, 0, -200, 200, float32(math.Inf(1)), float32(math.Inf(-1)))
	for _, lse := range []float32{0, 3.5, -20} {
		r1, r2 := append([]float32(nil), x...), append([]float32(nil), x...)
		expMinus32(r1, lse)
		expMinus32Go(r2, lse)
		require.Equal(t, r2, r1, "lse %v", lse)
	}
}

// TestLSEBackwardFastPathMatchesGo: the attention backward's p∘(dp -
// delta) bitwise as in Go, ragged tail and special values included.
func TestLSEBackwardFastPathMatchesGo(t *testing.T) {
	rng := newRNG(67)
	p := randSlice[float32](rng, 1003, 1)
	dp := randSlice[float32](rng, 1003, 30)
	p = append(p, 0, 1, 0, float32(math.Inf(1)), 1e-40)
	dp = append(dp, float32(math.Inf(1)), float32(math.NaN()), -0.0, 2, 3)
	for _, delta := range []float32{0, 0.75, -12.5} {
		r1, r2 := append([]float32(nil), dp...), append([]float32(nil), dp...)
		lseBackward32(p, r1, delta)
		lseBackwardGo(p, r2, delta)
		requireSameBits(t, r1, r2, fmt.Sprintf("delta %v", delta))
	}
}

// TestAdamWFastPathMatchesGo: AdamW's float32 update (vectorised C in the
// cgo build) equals the Go loop bitwise, ragged tail and zero moments
// included, over several steps.
func TestAdamWFastPathMatchesGo(t *testing.T) {
	rng := newRNG(66)
	n := 1000 + 13
	p1 := randSlice[float32](rng, n, 1)
	m1, v1 := make([]float32, n), make([]float32, n)
	p2, m2, v2 := append([]float32(nil), p1...), make([]float32, n), make([]float32, n)
	for step := 1; step <= 3; step++ {
		g := randSlice[float32](rng, n, 1e-3*float64(step))
		g[0], g[1] = 0, 1e4
		AdamW(p1, g, m1, v1, 1e-3, 0.9, 0.95, 1e-8, 0.1, step)
		adamWGo(p2, g, m2, v2, 1, float32(1-1e-3*0.1), float32(0.9), float32(0.95), float32(1-0.9), float32(1-0.95),
			float32(1e-3/(1-math.Pow(0.9, float64(step)))), float32(math.Sqrt(1-math.Pow(0.95, float64(step)))), float32(1e-8))
		require.Equal(t, p2, p1, "params at step %d", step)
		require.Equal(t, m2, m1, "first moments at step %d", step)
		require.Equal(t, v2, v1, "second moments at step %d", step)
	}
}

func TestBiasFastPathMatchesGo(t *testing.T) {
	rng := newRNG(64)
	rows, cols := 37, 77
	dy := randSlice[float32](rng, rows*cols, 1)
	p1 := randSlice[float32](rng, cols, 1)
	p2 := append([]float32(nil), p1...)
	colSums32(dy, p1, cols)
	colSumsGo(dy, p2, cols)
	require.Equal(t, p2, p1, "column sums")
	y1 := append([]float32(nil), dy...)
	addBias32(y1, p1, cols)
	addBiasGo(dy, p1, cols)
	require.Equal(t, dy, y1, "add bias")
}

func TestSoftmaxRows32(t *testing.T) {
	rng := newRNG(62)
	rows, n := 9, 1000
	src := randSlice[float32](rng, rows*n, 20)
	for r := 0; r < rows; r++ {
		src[r*n] = float32(math.Inf(-1))
	}
	dst := make([]float32, rows*n)
	maxs, sums := make([]float32, rows), make([]float32, rows)
	softmaxRows32(src, dst, rows, n, maxs, sums)
	for r := 0; r < rows; r++ {
		row := to64(src[r*n : (r+1)*n])
		mx := math.Inf(-1)
		for _, v := range row {
			mx = math.Max(mx, v)
		}
		var sum float64
		for _, v := range row {
			sum += math.Exp(v - mx)
		}
		want := make([]float64, n)
		for i, v := range row {
			want[i] = math.Exp(v-mx) / sum
		}
		requireClose(t, dst[r*n:(r+1)*n], want, 1e-6, "softmax row")
		require.Zero(t, dst[r*n], "a -Inf logit has probability 0")
		require.Equal(t, float32(mx), maxs[r])
		require.InDelta(t, sum, float64(sums[r]), 1e-6*sum)
	}
}

// The vectorised Add and Axpy are bitwise their Go loops, with z aliasing
// an input, zeros of either sign, and a length no vector width divides.
func TestAddAxpyFastPathMatchesGo(t *testing.T) {
	rng := newRNG(65)
	n := 1000 + 13
	x, y := randSlice[float32](rng, n, 1), randSlice[float32](rng, n, 1)
	for i := 0; i < n; i += 9 {
		x[i], y[i] = float32(math.Copysign(0, float64(x[i]))), float32(math.Copysign(0, float64(-x[i])))
	}
	z1, z2 := make([]float32, n), make([]float32, n)
	add32(x, y, z1)
	addGo(x, y, z2)
	requireSameBits(t, z1, z2, "add")
	a1, a2 := append([]float32(nil), x...), append([]float32(nil), x...)
	add32(a1, y, a1)
	addGo(a2, y, a2)
	requireSameBits(t, a1, a2, "add in place")
	for _, a := range []float32{1, -0.37} {
		y1, y2 := append([]float32(nil), y...), append([]float32(nil), y...)
		axpy32(a, x, y1)
		axpyGo(a, x, y2)
		requireSameBits(t, y1, y2, "axpy")
	}
}

// The GELU backward on a bfloat16 input is, in C and in Go, bitwise the
// float32 loop on the widened input.
func TestGeluBackwardBF16MatchesWidened(t *testing.T) {
	rng := newRNG(66)
	x := randSlice[float32](rng, 10003, 12)
	x = append(x, 0, float32(math.Copysign(0, -1)), 1e-30, -1e-30, 80, -80, 1e4, -1e4)
	h := make([]uint16, len(x))
	BF16FromF32s(h, x)
	w := make([]float32, len(x))
	BF16ToF32s(w, h)
	dy := randSlice[float32](rng, len(x), 1)
	want := randSlice[float32](rng, len(x), 1)
	c, g := append([]float32(nil), want...), append([]float32(nil), want...)
	geluBwd32Go(w, dy, want)
	geluBwdBF16(h, dy, c)
	geluBwdBF16Go(h, dy, g)
	requireSameBits(t, c, want, "C loop")
	requireSameBits(t, g, want, "Go loop")
}

// The one-pass forms of the GELU and LayerNorm backwards, which write dx
// rather than add to it, are, in C and in Go, bitwise the accumulating
// loops into a zeroed dx, on dy holding zeros of either sign (a term of
// -0 must come out +0, as 0 + -0 does).
func TestBackwardSetFastPathMatchesAdded(t *testing.T) {
	rng := newRNG(67)
	x := randSlice[float32](rng, 10003, 12)
	x = append(x, 0, float32(math.Copysign(0, -1)), 1e-30, -1e-30, 80, -80, 1e4, -1e4)
	dy := randSlice[float32](rng, len(x), 1)
	for i := 0; i < len(dy); i += 5 {
		dy[i] = float32(math.Copysign(0, float64(dy[i])))
	}
	h := make([]uint16, len(x))
	BF16FromF32s(h, x)
	wide := make([]float32, len(x))
	BF16ToF32s(wide, h)
	for _, c := range []struct {
		name            string
		added, cgo, goo func(dx []float32)
	}{
		{"gelu", func(dx []float32) { geluBwd32Go(x, dy, dx) },
			func(dx []float32) { geluBwd32Set(x, dy, dx) }, func(dx []float32) { geluBwd32SetGo(x, dy, dx) }},
		{"gelu bf16", func(dx []float32) { geluBwd32Go(wide, dy, dx) },
			func(dx []float32) { geluBwdBF16Set(h, dy, dx) }, func(dx []float32) { geluBwdBF16SetGo(h, dy, dx) }},
	} {
		want := make([]float32, len(x))
		c.added(want)
		got1, got2 := garbage[float32](len(x)), garbage[float32](len(x))
		c.cgo(got1)
		c.goo(got2)
		requireSameBits(t, got1, want, c.name+" C loop")
		requireSameBits(t, got2, want, c.name+" Go loop")
	}

	for _, cols := range []int{1, 7, 16, 256, 301} {
		rows := 5
		x := randSlice[float32](rng, rows*cols, 3)
		w := randSlice[float32](rng, cols, 1)
		m, r := make([]float32, rows), make([]float32, rows)
		layerNormFwdGo(x, w, w, make([]float32, rows*cols), m, r, cols, 1e-5)
		dy := randSlice[float32](rng, rows*cols, 1)
		clear(dy[2*cols : 3*cols]) // terms of -0 where w < 0 < xhat
		pw0, pb0 := randSlice[float32](rng, cols, 1), randSlice[float32](rng, cols, 1)
		want := make([]float32, rows*cols)
		wpw, wpb := append([]float32(nil), pw0...), append([]float32(nil), pb0...)
		layerNormBwdGo(dy, x, w, m, r, want, wpw, wpb, cols, false)
		for _, goLoop := range []bool{false, true} {
			dx := garbage[float32](rows * cols)
			pw, pb := append([]float32(nil), pw0...), append([]float32(nil), pb0...)
			if goLoop {
				layerNormBwdGo(dy, x, w, m, r, dx, pw, pb, cols, true)
			} else {
				layerNormBwd32Set(dy, x, w, m, r, dx, pw, pb, cols)
			}
			requireSameBits(t, dx, want, fmt.Sprintf("layernorm dx cols=%d go=%v", cols, goLoop))
			requireSameBits(t, pw, wpw, "dw partial")
			requireSameBits(t, pb, wpb, "db partial")
		}
	}
}

// TestSoftmaxMaxMatchesGo puts a row's maximum at every position, in each
// lane of the vectorised running maxima and in the tail, and a NaN first
// (it wins every comparison's fallback) or later (it loses them all): the
// C loop must pick the same maximum as the Go loop's single running one,
// so every output bit agrees.
func TestSoftmaxMaxMatchesGo(t *testing.T) {
	rng := newRNG(67)
	bits := func(x []float32) []uint32 {
		b := make([]uint32, len(x))
		for i, v := range x {
			b[i] = math.Float32bits(v)
		}
		return b
	}
	nan := float32(math.NaN())
	for _, n := range []int{1, 16, 33, 100} {
		for p := range n {
			for _, top := range []float32{50, nan} {
				src := randSlice[float32](rng, n, 5)
				src[p] = top
				p1, p2 := make([]float32, n), make([]float32, n)
				var m1, s1, m2, s2 [1]float32
				softmaxRows32(src, p1, 1, n, m1[:], s1[:])
				softmaxRows32Go(src, p2, 1, n, m2[:], s2[:])
				require.Equal(t, bits(p2), bits(p1), "n=%d, %g at %d", n, top, p)
				require.Equal(t, bits(m2[:]), bits(m1[:]), "maximum, n=%d, %g at %d", n, top, p)
				require.Equal(t, bits(s2[:]), bits(s1[:]), "sum, n=%d, %g at %d", n, top, p)
				if top == 50 {
					require.Equal(t, float32(50), m1[0])
				}
			}
		}
	}
}

// TestLSERowsFastPathMatchesGo checks the C log-sum-exp of row maxima and
// sums, whose logarithm is math.Log's arithmetic written out in C, bit for
// bit against the Go loop's math.Log: sums over the whole float32 range
// (the attention's lie in [1, keys]), the special cases (an empty row's
// -Inf and 0, negatives, infinities, NaN) and maxima of both signs.
func TestLSERowsFastPathMatchesGo(t *testing.T) {
	rng := newRNG(71)
	inf := float32(math.Inf(1))
	sums := []float32{0, float32(math.Copysign(0, -1)), 1, 2, 0.5, 1e-45, 1e-38, math.MaxFloat32, inf, -inf, -1,
		float32(math.NaN()), float32(math.Sqrt2 / 2), float32(math.Sqrt2)}
	for range 200000 {
		sums = append(sums, float32(1+rng.Float64()*255), math.Float32frombits(rng.Uint32()&0x7fffffff))
	}
	maxs := make([]float32, len(sums))
	for i := range maxs {
		maxs[i] = float32(rng.NormFloat64() * 4)
	}
	maxs[0] = -inf // an empty row
	for _, m := range [][]float32{make([]float32, len(sums)), maxs} {
		l1, l2 := make([]float32, len(sums)), make([]float32, len(sums))
		lseRows32(l1, m, sums)
		lseRowsGo(l2, m, sums)
		for i := range sums {
			if math.Float32bits(l1[i]) != math.Float32bits(l2[i]) {
				t.Fatalf("max %g, sum %g (%#x): C %g (%#x), Go %g (%#x)", m[i], sums[i], math.Float32bits(sums[i]),
					l1[i], math.Float32bits(l1[i]), l2[i], math.Float32bits(l2[i]))
			}
		}
	}
}

// TestAttentionDeltaFastPathMatchesGo runs the float32 AttentionDelta
// ((row, head) pairs summed side by side in C) against its Go loop, bit for bit, on row
// ranges that start anywhere and end inside a group of rows, over batches
// and heads, with a row stride wider than the heads.
func TestAttentionDeltaFastPathMatchesGo(t *testing.T) {
	rng := newRNG(73)
	d := AttnDims{B: 3, NH: 3, HS: 20, Tq: 13, Tk: 13, LdQ: 70, LdK: 70, LdV: 70, LdO: 70}
	dout := randSlice[float32](rng, d.B*d.Tq*d.LdO, 1)
	out := randSlice[float32](rng, d.B*d.Tq*d.LdO, 100)
	for _, r := range [][2]int{{0, 39}, {0, 8}, {3, 30}, {5, 6}, {38, 39}, {7, 7}} {
		d1, d2 := make([]float32, d.B*d.NH*d.Tq), make([]float32, d.B*d.NH*d.Tq)
		attnDelta32(d, dout, out, d1, r[0], r[1])
		attentionDeltaGo(d, dout, out, d2, r[0], r[1])
		require.Equal(t, d2, d1, "rows %v", r)
	}
}

// TestAttentionRowsFastPathMatchesGo runs the row-block forms of expMinus
// and lseBackward in C against their Go loops, bit for bit, on rows with
// empty, partial and full prefixes, zeros out to different ends, and
// entries past the ends that must stay as they were.
func TestAttentionRowsFastPathMatchesGo(t *testing.T) {
	rng := newRNG(79)
	ld := 40
	lens := []int64{0, 3, 17, 32, 40, 0, 1}
	ends := []int64{0, 32, 20, 32, 40, 16, 1}
	rows := len(lens)
	lse := randSlice[float32](rng, rows, 3)
	lse[5] = float32(math.Inf(-1))
	e1 := randSlice[float32](rng, rows*ld, 6)
	e2 := append([]float32(nil), e1...)
	expMinusRows32(e1, ld, lens, ends, lse)
	expMinusRowsGo(e2, ld, lens, ends, lse)
	require.Equal(t, e2, e1, "exp rows")
	delta := randSlice[float32](rng, rows, 1)
	d1 := randSlice[float32](rng, rows*ld, 1)
	d2 := append([]float32(nil), d1...)
	lseBackwardRows32(e1, d1, ld, lens, ends, delta)
	lseBackwardRowsGo(e2, d2, ld, lens, ends, delta)
	require.Equal(t, d2, d1, "lse backward rows")
	for r := range rows {
		for i := lens[r]; i < ends[r]; i++ {
			require.Zero(t, d1[r*ld+int(i)], "row %d entry %d past the visible keys", r, i)
		}
	}
}

// TestSoftmaxBackwardFloat32: the float32 softmax backward (its dot
// product in partial sums) against float64 on the same row of
// probabilities, norm-wise within 1e-6.
func TestSoftmaxBackwardFloat32(t *testing.T) {
	rng := newRNG(76)
	const n = 301
	p, dp := randSlice[float32](rng, n, 1), randSlice[float32](rng, n, 1)
	var z float32
	for i := range p {
		p[i] = float32(math.Abs(float64(p[i])))
		z += p[i]
	}
	for i := range p {
		p[i] /= z
	}
	p64, dp64 := to64(p), to64(dp)
	softmaxBackward(p, dp)
	softmaxBackward(p64, dp64)
	require.Less(t, relErr(dp, dp64), 1e-6)
}
