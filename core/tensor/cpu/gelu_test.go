package cpu

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// refGelu is GPT-2's tanh GELU in float64, written in the equivalent
// sigmoid form x/(1+exp(-2u)) because 1+tanh(u) cancels to exactly 0 in
// float64 for x below about -6, while the true values (down to 1e-30 near
// x = -9) are still representable; TestGeluSigmoidIdentity ties the two forms.
func refGelu(x float64) float64 {
	u := math.Sqrt(2/math.Pi) * (x + 0.044715*x*x*x)
	return x / (1 + math.Exp(-2*u))
}

func TestGeluSigmoidIdentity(t *testing.T) {
	for x := -5.0; x <= 5; x += 1e-3 {
		tanhForm := 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
		require.InDelta(t, tanhForm, refGelu(x), 1e-15+1e-12*math.Abs(tanhForm), "x=%g", x)
	}
}

func TestGeluForwardFloat32Elementwise(t *testing.T) {
	// Dense over [-20, 20] plus extremes. The tolerance is a few ulps plus
	// the conditioning of exp: the exponent z = 2u carries float32 rounding
	// of up to |z| * 3e-7 (five roundings) before exp, which any float32 GELU inherits.
	x := denseInputs(-20, 20, 1e-4, 1e-30, -1e-30, 50, -50, 1e4, -1e4)
	y := make([]float32, len(x))
	GeluForward(x, y)
	for i, v := range x {
		want := refGelu(float64(v))
		got := float64(y[i])
		z := 2 * math.Sqrt(2/math.Pi) * math.Abs(float64(v)+0.044715*math.Pow(float64(v), 3))
		require.False(t, math.IsNaN(got) || math.IsInf(got, 0), "gelu(%g) = %g", v, got)
		tol := (3e-7+3e-7*min(z, 100))*math.Abs(want) + 1e-33 + 2e-35*math.Abs(float64(v))
		require.LessOrEqual(t, math.Abs(got-want), tol, "gelu(%g) = %g, want %g", v, got, want)
	}
}

func testGeluForward[T Float](t *testing.T) {
	rng := newRNG(11)
	x := randSlice[T](rng, 100003, 6)
	y := make([]T, len(x))
	GeluForward(x, y)
	want := make([]float64, len(x))
	for i, v := range x {
		want[i] = refGelu(float64(v))
	}
	requireClose(t, y, want, tolFor[T](3e-7, 1e-15), "gelu")
}

func TestGeluForward(t *testing.T) {
	t.Run("float32", testGeluForward[float32])
	t.Run("float64", testGeluForward[float64])
}

func TestGeluBackwardFiniteDifferences(t *testing.T) {
	rng := newRNG(12)
	x := randSlice[float64](rng, 2000, 5)
	dy := randSlice[float64](rng, len(x), 1)
	dx := randSlice[float64](rng, len(x), 1) // accumulated into
	dx0 := append([]float64(nil), dx...)
	GeluBackward(x, dy, dx)
	const h = 1e-5
	for i, v := range x {
		fd := (refGelu(v+h) - refGelu(v-h)) / (2 * h)
		want := dx0[i] + dy[i]*fd
		require.InDelta(t, want, dx[i], 1e-8*(1+math.Abs(want)), "x=%g", v)
	}
}

func TestGeluBackwardFloat32(t *testing.T) {
	rng := newRNG(13)
	x := randSlice[float32](rng, 100003, 8)
	dy := randSlice[float32](rng, len(x), 1)
	dx := randSlice[float32](rng, len(x), 1)
	want := to64(dx)
	for i, v := range to64(x) {
		th := math.Tanh(math.Sqrt(2/math.Pi) * (v + 0.044715*v*v*v))
		d := 0.5*(1+th) + 0.5*v*(1-th*th)*math.Sqrt(2/math.Pi)*(1+3*0.044715*v*v)
		want[i] += float64(dy[i]) * d
	}
	GeluBackward(x, dy, dx)
	requireClose(t, dx, want, 1e-6, "gelu backward")
}

func TestGeluLengthMismatch(t *testing.T) {
	require.PanicsWithValue(t, "cpu.GeluForward: argument 1 has 2 elements, need at least 3",
		func() { GeluForward(make([]float32, 3), make([]float32, 2)) })
}

// GeluBackwardFresh into a buffer of garbage is bitwise GeluBackward into
// a zeroed one, on several chunks per thread and a ragged tail, with
// zeros of either sign in dy (0 + -0 is +0: a plain store would differ).
func testGeluBackwardFresh[T Float](t *testing.T) {
	rng := newRNG(17)
	x := randSlice[T](rng, 5*elemGrain+37, 6)
	dy := randSlice[T](rng, len(x), 1)
	for i := 0; i < len(dy); i += 101 {
		dy[i] = T(math.Copysign(0, float64(dy[i])))
	}
	want := make([]T, len(x))
	GeluBackward(x, dy, want)
	naive := garbage[T](len(x))
	geluBackwardFreshNaive(x, dy, naive)
	requireSameBits(t, naive, want, "gelu backward cleared and added to")
	for _, n := range []int{1, 2, 3} {
		withThreads(n, func() {
			got := garbage[T](len(x))
			GeluBackwardFresh(x, dy, got)
			requireSameBits(t, got, want, "gelu backward fresh")
		})
	}
}

func TestGeluBackwardFresh(t *testing.T) {
	t.Run("float32", testGeluBackwardFresh[float32])
	t.Run("float64", testGeluBackwardFresh[float64])
}

// GeluBackwardFreshHalf is bitwise GeluBackwardFresh on the widened
// input, bf16 and fp16.
func TestGeluBackwardFreshHalf(t *testing.T) {
	rng := newRNG(18)
	x := randSlice[float32](rng, 3*elemGrain+5, 6)
	dy := randSlice[float32](rng, len(x), 1)
	for i := 0; i < len(dy); i += 101 {
		dy[i] = float32(math.Copysign(0, float64(dy[i])))
	}
	for _, f16 := range []bool{false, true} {
		h := make([]uint16, len(x))
		w := make([]float32, len(x))
		if f16 {
			F16FromF32s(h, x)
			F16ToF32s(w, h)
		} else {
			BF16FromF32s(h, x)
			BF16ToF32s(w, h)
		}
		want := garbage[float32](len(x))
		geluBackwardFreshNaive(w, dy, want)
		for _, n := range []int{1, 2, 3} {
			withThreads(n, func() {
				got := garbage[float32](len(x))
				GeluBackwardFreshHalf(f16, h, dy, got)
				requireSameBits(t, got, want, "gelu backward on a 2-byte input")
			})
		}
	}
}
