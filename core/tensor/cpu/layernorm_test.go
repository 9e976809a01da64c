package cpu

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// refLayerNorm is the textbook LayerNorm in float64.
func refLayerNorm(x, w, b []float64, rows, cols int, eps float64) (y, mean, rstd []float64) {
	y = make([]float64, rows*cols)
	mean = make([]float64, rows)
	rstd = make([]float64, rows)
	for r := 0; r < rows; r++ {
		xr := x[r*cols : (r+1)*cols]
		var m float64
		for _, v := range xr {
			m += v
		}
		m /= float64(cols)
		var vr float64
		for _, v := range xr {
			vr += (v - m) * (v - m)
		}
		vr /= float64(cols)
		rs := 1 / math.Sqrt(vr+eps)
		for i, v := range xr {
			y[r*cols+i] = (v-m)*rs*w[i] + b[i]
		}
		mean[r], rstd[r] = m, rs
	}
	return y, mean, rstd
}

func testLayerNormForward[T Float](t *testing.T) {
	rng := newRNG(21)
	rows, cols := 67, 96
	x := randSlice[T](rng, rows*cols, 3)
	for i := range x { // a large common offset tests the two-pass variance
		x[i] += 10
	}
	w := randSlice[T](rng, cols, 1)
	b := randSlice[T](rng, cols, 1)
	y := make([]T, rows*cols)
	mean, rstd := make([]T, rows), make([]T, rows)
	LayerNormForward(x, w, b, y, mean, rstd, rows, cols, 1e-5)
	wy, wm, wr := refLayerNorm(to64(x), to64(w), to64(b), rows, cols, 1e-5)
	tol := tolFor[T](1e-6, 1e-13)
	requireClose(t, y, wy, tol, "y")
	requireClose(t, mean, wm, tol, "mean")
	requireClose(t, rstd, wr, tol, "rstd")
}

func TestLayerNormForward(t *testing.T) {
	t.Run("float32", testLayerNormForward[float32])
	t.Run("float64", testLayerNormForward[float64])
}

// TestLayerNormBackwardFiniteDifferences checks dx, dw and db against
// central differences of L = sum(g * y) in float64; the gradient buffers
// start non-zero to check that the kernel accumulates.
func TestLayerNormBackwardFiniteDifferences(t *testing.T) {
	rng := newRNG(22)
	rows, cols := 5, 7
	const eps = 1e-5
	x := randSlice[float64](rng, rows*cols, 2)
	w := randSlice[float64](rng, cols, 1)
	b := randSlice[float64](rng, cols, 1)
	g := randSlice[float64](rng, rows*cols, 1)
	loss := func(x, w, b []float64) float64 {
		y, _, _ := refLayerNorm(x, w, b, rows, cols, eps)
		var s float64
		for i := range y {
			s += g[i] * y[i]
		}
		return s
	}
	fd := func(p []float64) []float64 {
		out := make([]float64, len(p))
		for i := range p {
			old := p[i]
			p[i] = old + 1e-6
			lp := loss(x, w, b)
			p[i] = old - 1e-6
			lm := loss(x, w, b)
			p[i] = old
			out[i] = (lp - lm) / 2e-6
		}
		return out
	}
	y := make([]float64, rows*cols)
	mean, rstd := make([]float64, rows), make([]float64, rows)
	LayerNormForward(x, w, b, y, mean, rstd, rows, cols, eps)
	dx, dw, db := randSlice[float64](rng, rows*cols, 1), randSlice[float64](rng, cols, 1), randSlice[float64](rng, cols, 1)
	wantDx, wantDw, wantDb := fd(x), fd(w), fd(b)
	for i := range wantDx {
		wantDx[i] += dx[i]
	}
	for i := range wantDw {
		wantDw[i] += dw[i]
		wantDb[i] += db[i]
	}
	LayerNormBackward(g, x, w, mean, rstd, dx, dw, db, rows, cols)
	requireClose(t, dx, wantDx, 1e-8, "dx")
	requireClose(t, dw, wantDw, 1e-8, "dw")
	requireClose(t, db, wantDb, 1e-8, "db")
}

// refLayerNormBackward is the analytic backward written out in float64.
func refLayerNormBackward(dy, x, w []float64, rows, cols int, eps float64) (dx, dw, db []float64) {
	_, mean, rstd := refLayerNorm(x, w, make([]float64, cols), rows, cols, eps)
	dx, dw, db = make([]float64, rows*cols), make([]float64, cols), make([]float64, cols)
	for r := 0; r < rows; r++ {
		var a, c float64
		for i := 0; i < cols; i++ {
			xh := (x[r*cols+i] - mean[r]) * rstd[r]
			a += dy[r*cols+i] * w[i]
			c += dy[r*cols+i] * w[i] * xh
		}
		a /= float64(cols)
		c /= float64(cols)
		for i := 0; i < cols; i++ {
			xh := (x[r*cols+i] - mean[r]) * rstd[r]
			dx[r*cols+i] = (dy[r*cols+i]*w[i] - a - xh*c) * rstd[r]
			dw[i] += dy[r*cols+i] * xh
			db[i] += dy[r*cols+i]
		}
	}
	return dx, dw, db
}

func TestLayerNormBackwardFloat32(t *testing.T) {
	rng := newRNG(23)
	rows, cols := 301, 256
	x := randSlice[float32](rng, rows*cols, 2)
	w := randSlice[float32](rng, cols, 1)
	b := randSlice[float32](rng, cols, 1)
	dy := randSlice[float32](rng, rows*cols, 1)
	y := make([]float32, rows*cols)
	mean, rstd := make([]float32, rows), make([]float32, rows)
	LayerNormForward(x, w, b, y, mean, rstd, rows, cols, 1e-5)
	dx, dw, db := make([]float32, rows*cols), make([]float32, cols), make([]float32, cols)
	LayerNormBackward(dy, x, w, mean, rstd, dx, dw, db, rows, cols)
	wdx, wdw, wdb := refLayerNormBackward(to64(dy), to64(x), to64(w), rows, cols, 1e-5)
	requireClose(t, dx, wdx, 2e-6, "dx")
	requireClose(t, dw, wdw, 2e-6, "dw")
	requireClose(t, db, wdb, 2e-6, "db")
}

func TestLayerNormBackwardDeterministic(t *testing.T) {
	rng := newRNG(24)
	rows, cols := 1000, 130
	x := randSlice[float32](rng, rows*cols, 2)
	w := randSlice[float32](rng, cols, 1)
	dy := randSlice[float32](rng, rows*cols, 1)
	mean, rstd := make([]float32, rows), make([]float32, rows)
	LayerNormForward(x, w, w, make([]float32, rows*cols), mean, rstd, rows, cols, 1e-5)
	run := func(n int) (dx, dw, db []float32) {
		withThreads(n, func() {
			dx, dw, db = make([]float32, rows*cols), make([]float32, cols), make([]float32, cols)
			LayerNormBackward(dy, x, w, mean, rstd, dx, dw, db, rows, cols)
		})
		return
	}
	dx1, dw1, db1 := run(1)
	for _, n := range []int{2, 3, 8} {
		dx, dw, db := run(n)
		require.Equal(t, dx1, dx, "dx with %d threads", n)
		require.Equal(t, dw1, dw, "dw with %d threads", n)
		require.Equal(t, db1, db, "db with %d threads", n)
	}
}

func TestLayerNormBadShape(t *testing.T) {
	require.PanicsWithValue(t, "cpu.LayerNormForward: per-column argument 1 has 3 elements, need cols = 4",
		func() {
			LayerNormForward(make([]float32, 8), make([]float32, 3), make([]float32, 4), make([]float32, 8),
				make([]float32, 2), make([]float32, 2), 2, 4, 1e-5)
		})
}

// LayerNormBackwardFresh writes dx over garbage bitwise as
// LayerNormBackward adds it to zeros, zeros of either sign in dy
// included; dw and db accumulate in both.
func testLayerNormBackwardFresh[T Float](t *testing.T) {
	rng := newRNG(25)
	rows, cols := 301, 96
	x := randSlice[T](rng, rows*cols, 2)
	w := randSlice[T](rng, cols, 1)
	dy := randSlice[T](rng, rows*cols, 1)
	for i := 0; i < len(dy); i += 7 {
		dy[i] = T(math.Copysign(0, float64(dy[i])))
	}
	clear(dy[3*cols : 4*cols]) // a row of zeros: terms of -0 where w < 0 < xhat
	mean, rstd := make([]T, rows), make([]T, rows)
	LayerNormForward(x, w, w, make([]T, rows*cols), mean, rstd, rows, cols, 1e-5)
	dw0, db0 := randSlice[T](rng, cols, 1), randSlice[T](rng, cols, 1)
	wdx := make([]T, rows*cols)
	wdw, wdb := append([]T(nil), dw0...), append([]T(nil), db0...)
	LayerNormBackward(dy, x, w, mean, rstd, wdx, wdw, wdb, rows, cols)
	for _, n := range []int{1, 2, 3} {
		withThreads(n, func() {
			dx := garbage[T](rows * cols)
			dw, db := append([]T(nil), dw0...), append([]T(nil), db0...)
			LayerNormBackwardFresh(dy, x, w, mean, rstd, dx, dw, db, rows, cols)
			requireSameBits(t, dx, wdx, "dx")
			requireSameBits(t, dw, wdw, "dw")
			requireSameBits(t, db, wdb, "db")
		})
	}
}

func TestLayerNormBackwardFresh(t *testing.T) {
	t.Run("float32", testLayerNormBackwardFresh[float32])
	t.Run("float64", testLayerNormBackwardFresh[float64])
}

// LayerNormBackwardFreshHalf is bitwise LayerNormBackwardFresh on the
// widened input, bf16 and fp16, for every thread count and a last block
// of rows short.
func TestLayerNormBackwardFreshHalf(t *testing.T) {
	rng := newRNG(26)
	rows, cols := 301, 96
	x0 := randSlice[float32](rng, rows*cols, 2)
	w := randSlice[float32](rng, cols, 1)
	dy := randSlice[float32](rng, rows*cols, 1)
	dw0, db0 := randSlice[float32](rng, cols, 1), randSlice[float32](rng, cols, 1)
	for _, f16 := range []bool{false, true} {
		h := make([]uint16, len(x0))
		x := make([]float32, len(x0))
		if f16 {
			F16FromF32s(h, x0)
			F16ToF32s(x, h)
		} else {
			BF16FromF32s(h, x0)
			BF16ToF32s(x, h)
		}
		mean, rstd := make([]float32, rows), make([]float32, rows)
		LayerNormForward(x, w, w, make([]float32, rows*cols), mean, rstd, rows, cols, 1e-5)
		wdx := garbage[float32](rows * cols)
		wdw, wdb := append([]float32(nil), dw0...), append([]float32(nil), db0...)
		LayerNormBackwardFresh(dy, x, w, mean, rstd, wdx, wdw, wdb, rows, cols)
		for _, n := range []int{1, 2, 3} {
			withThreads(n, func() {
				dx := garbage[float32](rows * cols)
				dw, db := append([]float32(nil), dw0...), append([]float32(nil), db0...)
				LayerNormBackwardFreshHalf(f16, dy, h, w, mean, rstd, dx, dw, db, rows, cols)
				requireSameBits(t, dx, wdx, "dx")
				requireSameBits(t, dw, wdw, "dw")
				requireSameBits(t, db, wdb, "db")
			})
		}
	}
}
