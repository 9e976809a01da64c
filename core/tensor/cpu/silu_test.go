package cpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// siluInputs returns rows of [gate | up] with gates over the whole range
// the clamp of siluExp cuts (and past it), zeros and signed zeros among them.
func siluInputs(rows, I int) []float32 {
	rng := newRNG(21)
	x := randSlice[float32](rng, 2*rows*I, 4)
	special := []float32{0, float32(math.Copysign(0, -1)), 1e-30, -1e-30, 79.9, 80.1, -80.1, 87.4, -87.4, 90, -90, 200, -200, -1.2785}
	for i, v := range special {
		x[(i%rows)*2*I+i%I] = v
	}
	return x
}

// TestSiluMulFastPathMatchesGo: the C loops of the cgo build give the Go
// loops' bits (the same in the pure-Go build, where they are the Go loops).
func TestSiluMulFastPathMatchesGo(t *testing.T) {
	for _, sz := range [][2]int{{1, 1}, {3, 17}, {37, 704}} {
		rows, I := sz[0], sz[1]
		x, dy := siluInputs(rows, I), randSlice[float32](newRNG(22), rows*I, 1)
		y1, y2 := make([]float32, rows*I), make([]float32, rows*I)
		siluMulFwd32(x, y1, rows, I)
		siluMulFwd32Go(x, y2, rows, I)
		requireSameBits(t, y1, y2, "forward")
		d1, d2 := make([]float32, 2*rows*I), make([]float32, 2*rows*I)
		siluMulBwd32(x, dy, d1, rows, I)
		siluMulBwd32Go(x, dy, d2, rows, I)
		requireSameBits(t, d1, d2, "backward")
	}
}

// TestSiluMulFloat32: the float32 forward and backward against the float64
// ones (math.Exp) on the same inputs, norm-wise within 1e-6, and every
// element of dx set whatever it held.
func TestSiluMulFloat32(t *testing.T) {
	const rows, I = 29, 96
	x := siluInputs(rows, I)
	dy := randSlice[float32](newRNG(23), rows*I, 1)
	x64, dy64 := to64(x), to64(dy)
	y, y64 := make([]float32, rows*I), make([]float64, rows*I)
	SiluMulForward(x, y, rows, I)
	SiluMulForward(x64, y64, rows, I)
	dx, dx64 := make([]float32, 2*rows*I), make([]float64, 2*rows*I)
	for i := range dx {
		dx[i] = float32(math.NaN())
	}
	SiluMulBackward(x, dy, dx, rows, I)
	SiluMulBackward(x64, dy64, dx64, rows, I)
	require.Less(t, relErr(y, y64), 1e-6, "forward")
	require.Less(t, relErr(dx, dx64), 1e-6, "backward")
}

// TestSiluMulBackwardHalf: the backward on gate|up stored in 2 bytes (bf16
// and fp16) is bitwise the backward on them widened, over more rows than
// one chunk of the widening.
func TestSiluMulBackwardHalf(t *testing.T) {
	for _, f16 := range []bool{false, true} {
		const rows, I = 150, 96
		x := siluInputs(rows, I)
		h, wide := make([]uint16, len(x)), make([]float32, len(x))
		if f16 {
			F16FromF32s(h, x)
			F16ToF32s(wide, h)
		} else {
			BF16FromF32s(h, x)
			BF16ToF32s(wide, h)
		}
		dy := randSlice[float32](newRNG(24), rows*I, 1)
		d1, d2 := make([]float32, 2*rows*I), make([]float32, 2*rows*I)
		SiluMulBackward(wide, dy, d1, rows, I)
		SiluMulBackwardHalf(f16, h, dy, d2, rows, I)
		requireSameBits(t, d1, d2, fmt.Sprintf("f16 %v", f16))
	}
}
