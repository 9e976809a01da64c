package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// randSlice returns n values uniform in [-scale, scale) from a fixed seed.
func randSlice[T Float](rng *rand.Rand, n int, scale float64) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = T((rng.Float64()*2 - 1) * scale)
	}
	return out
}

func newRNG(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)) }

func to64[T Float](x []T) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v)
	}
	return out
}

// relErr is the norm-wise relative error ||got-want|| / max(||want||, tiny).
func relErr[T Float](got []T, want []float64) float64 {
	var num, den float64
	for i := range want {
		d := float64(got[i]) - want[i]
		num += d * d
		den += want[i] * want[i]
	}
	return math.Sqrt(num) / math.Max(math.Sqrt(den), 1e-300)
}

// requireClose fails when the norm-wise relative error exceeds tol.
func requireClose[T Float](t *testing.T, got []T, want []float64, tol float64, what string) {
	t.Helper()
	require.Len(t, got, len(want), what)
	for i, v := range got {
		require.False(t, math.IsNaN(float64(v)) || math.IsInf(float64(v), 0), "%s: element %d is %v", what, i, v)
	}
	e := relErr(got, want)
	require.LessOrEqual(t, e, tol, "%s: relative error %.3g above %.3g", what, e, tol)
}

// withThreads runs f with SetThreads(n) and restores the previous value.
func withThreads(n int, f func()) {
	old := Threads()
	SetThreads(n)
	defer SetThreads(old)
	f()
}

// tolFor is the norm-wise tolerance for a kernel result of type T: float32
// results carry rounding of ~1e-7 per operation, float64 ~1e-16.
func tolFor[T Float](f32, f64 float64) float64 {
	if isF32[T]() {
		return f32
	}
	return f64
}

// requireSameBits fails unless got and want hold the same bit patterns
// (so a zero's sign counts, and NaNs compare).
func requireSameBits[T Float](t *testing.T, got, want []T, what string) {
	t.Helper()
	require.Len(t, got, len(want), what)
	for i := range want {
		g, w := bitsOf(got[i]), bitsOf(want[i])
		if g != w {
			require.Failf(t, what, "element %d: %v (bits %#x), want %v (bits %#x)", i, got[i], g, want[i], w)
		}
	}
}

// bitsOf is x's own bit pattern (a float32's not widened, which would
// quiet a signalling NaN).
func bitsOf[T Float](x T) uint64 {
	if f, ok := any(x).(float32); ok {
		return uint64(math.Float32bits(f))
	}
	return math.Float64bits(float64(x))
}

// garbage returns n NaNs: the contents of a reused buffer that a kernel
// writing its output must not read.
func garbage[T Float](n int) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = T(math.NaN())
	}
	return out
}
