package cpu

import (
	"encoding/binary"
	"math"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

func testAdamW[T Float](t *testing.T) {
	rng := newRNG(51)
	n := 40001
	p := randSlice[T](rng, n, 1)
	m, v := make([]T, n), make([]T, n)
	pw, mw, vw := to64(p), make([]float64, n), make([]float64, n)
	const lr, b1, b2, eps, wd = 1e-3, 0.9, 0.95, 1e-8, 0.1
	for step := 1; step <= 3; step++ {
		g := randSlice[T](rng, n, 0.5)
		if step == 2 {
			g[0] = 0 // zero gradient: the update is pure decay plus momentum
		}
		AdamW(p, g, m, v, lr, b1, b2, eps, wd, step)
		bc1 := 1 - math.Pow(b1, float64(step))
		bc2 := 1 - math.Pow(b2, float64(step))
		for i := range pw {
			gi := float64(g[i])
			pw[i] *= 1 - lr*wd
			mw[i] = b1*mw[i] + (1-b1)*gi
			vw[i] = b2*vw[i] + (1-b2)*gi*gi
			pw[i] -= lr / bc1 * mw[i] / (math.Sqrt(vw[i])/math.Sqrt(bc2) + eps)
		}
		tol := tolFor[T](1e-7, 1e-15)
		requireClose(t, p, pw, tol, "p")
		requireClose(t, m, mw, tol*10, "m")
		requireClose(t, v, vw, tol*10, "v")
	}
}

func TestAdamW(t *testing.T) {
	t.Run("float32", testAdamW[float32])
	t.Run("float64", testAdamW[float64])
}

// testAdamWScaled: AdamWScaled is bitwise Scale then AdamW (the trainer's
// unscaling and clipping folded into the step), ragged tail and the
// vectorised float32 loop included, and leaves the gradient as it was.
func testAdamWScaled[T Float](t *testing.T) {
	rng := newRNG(52)
	n := 40001
	p1 := randSlice[T](rng, n, 1)
	p2, m1, v1, m2, v2 := append([]T(nil), p1...), make([]T, n), make([]T, n), make([]T, n), make([]T, n)
	for step := 1; step <= 3; step++ {
		g := randSlice[T](rng, n, 4096)
		g[0], g[1] = 0, 1e4
		s := 0.37 / 65536 * float64(step)
		g1 := append([]T(nil), g...)
		AdamWScaled(p1, g1, m1, v1, s, 1e-3, 0.9, 0.95, 1e-8, 0.1, step)
		require.Equal(t, g, g1, "the gradient at step %d", step)
		Scale(g, T(s))
		AdamW(p2, g, m2, v2, 1e-3, 0.9, 0.95, 1e-8, 0.1, step)
		requireSameBits(t, p1, p2, "params")
		requireSameBits(t, m1, m2, "first moments")
		requireSameBits(t, v1, v2, "second moments")
	}
}

func TestAdamWScaled(t *testing.T) {
	t.Run("float32", testAdamWScaled[float32])
	t.Run("float64", testAdamWScaled[float64])
}

func TestSumSquaresAndScale(t *testing.T) {
	rng := newRNG(52)
	x := randSlice[float32](rng, 100003, 3)
	var want float64
	for _, v := range x {
		want += float64(v) * float64(v)
	}
	got := SumSquares(x)
	require.InDelta(t, want, got, 1e-12*want)
	withThreads(1, func() { require.Equal(t, got, SumSquares(x), "thread count changes the sum") })
	require.Zero(t, SumSquares([]float64{}))

	wantScaled := to64(x)
	for i := range wantScaled {
		wantScaled[i] *= float64(float32(0.37))
	}
	Scale(x, 0.37)
	requireClose(t, x, wantScaled, 1e-7, "scale")
}

func TestAxpyAdd(t *testing.T) {
	rng := newRNG(53)
	x := randSlice[float64](rng, 70001, 1)
	y := randSlice[float64](rng, len(x), 1)
	want := make([]float64, len(x))
	for i := range x {
		want[i] = y[i] + 2.5*x[i]
	}
	Axpy(2.5, x, y)
	require.Equal(t, want, y)

	sum := make([]float64, len(x))
	for i := range x {
		sum[i] = x[i] + y[i]
	}
	Add(x, y, x) // z aliases x
	require.Equal(t, sum, x)
}

func TestAddBiasBiasGrad(t *testing.T) {
	rng := newRNG(54)
	rows, cols := 333, 65
	y := randSlice[float32](rng, rows*cols, 1)
	b := randSlice[float32](rng, cols, 1)
	want := make([]float32, len(y))
	for i := range y {
		want[i] = y[i] + b[i%cols]
	}
	AddBias(y, b, rows, cols)
	require.Equal(t, want, y)

	db := randSlice[float32](rng, cols, 1) // accumulated into
	wantDb := to64(db)
	for i, v := range y {
		wantDb[i%cols] += float64(v)
	}
	BiasGrad(y, db, rows, cols)
	requireClose(t, db, wantDb, 1e-6, "db")
}

func TestBiasGradDeterministic(t *testing.T) {
	rng := newRNG(55)
	rows, cols := 2048, 256
	dy := randSlice[float32](rng, rows*cols, 1)
	run := func(n int) (db []float32) {
		withThreads(n, func() {
			db = make([]float32, cols)
			BiasGrad(dy, db, rows, cols)
		})
		return
	}
	one := run(1)
	require.Equal(t, one, run(2))
	require.Equal(t, one, run(5))
}

// TestAdamWMatchesTorch replays three AdamW steps recorded from PyTorch
// 1.13 (testdata/gen_adamw.py) and requires bitwise equal parameters.
func TestAdamWMatchesTorch(t *testing.T) {
	raw, err := os.ReadFile("testdata/adamw_torch.bin")
	require.NoError(t, err)
	const n = 4096
	require.Len(t, raw, 5*n*4)
	f := make([]float32, 5*n)
	for i := range f {
		f[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	p := append([]float32(nil), f[:n]...)
	m, v := make([]float32, n), make([]float32, n)
	for step := 1; step <= 3; step++ {
		AdamW(p, f[step*n:(step+1)*n], m, v, 6e-4, 0.9, 0.95, 1e-8, 0.1, step)
	}
	require.Equal(t, f[4*n:], p)
}

func TestClear(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		withThreads(n, func() {
			x := garbage[float32](40*elemGrain + 3)
			Clear(x)
			requireSameBits(t, x, make([]float32, len(x)), "cleared")
		})
	}
}
