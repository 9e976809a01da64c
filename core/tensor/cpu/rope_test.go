package cpu

import (
	"math"
	"testing"
)

// TestRopeRotateFastPathMatchesGo: the C loop of the cgo build gives the
// Go loop's bits, turning and turning back, over q and k heads of a fused
// row (the v columns untouched) and positions past T wrapping to r%T.
func TestRopeRotateFastPathMatchesGo(t *testing.T) {
	rng := newRNG(41)
	const rows, T, h, heads = 12, 5, 8, 3
	ld := 2 * h * (heads + 1) // the last head's columns stay unread
	cos, sin := make([]float64, T*h), make([]float64, T*h)
	for i := range cos {
		a := rng.Float64() * 2 * math.Pi
		cos[i], sin[i] = math.Cos(a), math.Sin(a)
	}
	x := randSlice[float32](rng, rows*ld, 2)
	for _, sign := range []float64{1, -1} {
		y1, y2 := randSlice[float32](rng, rows*ld, 1), make([]float32, rows*ld)
		copy(y2, y1)
		ropeRotate32(x, y1, 0, rows, T, ld, 2*h, 2*h*(heads-1), h, cos, sin, sign)
		ropeRotateGo(x, y2, 0, rows, T, ld, 2*h, 2*h*(heads-1), h, cos, sin, sign)
		requireSameBits(t, y1, y2, "rotate")
	}
}
