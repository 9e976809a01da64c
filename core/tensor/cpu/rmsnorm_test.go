package cpu

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRMSNormFastPathMatchesGo: the C loops of the cgo build give the Go
// loops' bits, forward and backward, at widths with and without a tail
// past the last full group of sumLanes.
func TestRMSNormFastPathMatchesGo(t *testing.T) {
	rng := newRNG(31)
	for _, sz := range [][2]int{{1, 1}, {3, 17}, {5, 256}, {7, 333}} {
		rows, cols := sz[0], sz[1]
		x, w := randSlice[float32](rng, rows*cols, 2), randSlice[float32](rng, cols, 1)
		dy := randSlice[float32](rng, rows*cols, 1)
		y1, y2 := make([]float32, rows*cols), make([]float32, rows*cols)
		r1, r2 := make([]float32, rows), make([]float32, rows)
		rmsNormFwd32(x, w, y1, r1, cols, 1e-5)
		rmsNormFwd32Go(x, w, y2, r2, cols, 1e-5)
		requireSameBits(t, y1, y2, "y")
		requireSameBits(t, r1, r2, "rstd")
		dx1, pw1 := randSlice[float32](rng, rows*cols, 1), randSlice[float32](rng, cols, 1)
		dx2, pw2 := append([]float32(nil), dx1...), append([]float32(nil), pw1...)
		rmsNormBwd32(dy, x, w, r1, dx1, pw1, cols)
		rmsNormBwd32Go(dy, x, w, r1, dx2, pw2, cols)
		requireSameBits(t, dx1, dx2, "dx")
		requireSameBits(t, pw1, pw2, "dw")
	}
}

// TestRMSNormFloat32: float32 RMSNorm, forward and backward (added into
// what dx and dw held), against float64 on the same inputs, norm-wise
// within 1e-6.
func TestRMSNormFloat32(t *testing.T) {
	rng := newRNG(32)
	const rows, cols = 67, 200 // more rows than one block of dw's sums
	x, w, dy := randSlice[float32](rng, rows*cols, 3), randSlice[float32](rng, cols, 1), randSlice[float32](rng, rows*cols, 1)
	dx, dw := randSlice[float32](rng, rows*cols, 1), randSlice[float32](rng, cols, 1)
	x64, w64, dy64, dx64, dw64 := to64(x), to64(w), to64(dy), to64(dx), to64(dw)
	y, r := make([]float32, rows*cols), make([]float32, rows)
	y64, r64 := make([]float64, rows*cols), make([]float64, rows)
	RMSNormForward(x, w, y, r, rows, cols, 1e-5)
	RMSNormForward(x64, w64, y64, r64, rows, cols, 1e-5)
	RMSNormBackward(dy, x, w, r, dx, dw, rows, cols)
	RMSNormBackward(dy64, x64, w64, r64, dx64, dw64, rows, cols)
	require.Less(t, relErr(y, y64), 1e-6, "y")
	require.Less(t, relErr(r, r64), 1e-6, "rstd")
	require.Less(t, relErr(dx, dx64), 1e-6, "dx")
	require.Less(t, relErr(dw, dw64), 1e-6, "dw")
}

// TestRMSNormBackwardHalf: the backward on x stored in 2 bytes (bf16 and
// fp16) is bitwise the backward on x widened, over more rows than one
// block of dw's sums.
func TestRMSNormBackwardHalf(t *testing.T) {
	rng := newRNG(33)
	const rows, cols = 70, 48
	for _, f16 := range []bool{false, true} {
		x := randSlice[float32](rng, rows*cols, 2)
		h := make([]uint16, len(x))
		wide := make([]float32, len(x))
		if f16 {
			F16FromF32s(h, x)
			F16ToF32s(wide, h)
		} else {
			BF16FromF32s(h, x)
			BF16ToF32s(wide, h)
		}
		w, dy, rstd := randSlice[float32](rng, cols, 1), randSlice[float32](rng, rows*cols, 1), make([]float32, rows)
		RMSNormForward(wide, w, make([]float32, rows*cols), rstd, rows, cols, 1e-5)
		dx1, dw1 := randSlice[float32](rng, rows*cols, 1), randSlice[float32](rng, cols, 1)
		dx2, dw2 := append([]float32(nil), dx1...), append([]float32(nil), dw1...)
		RMSNormBackward(dy, wide, w, rstd, dx1, dw1, rows, cols)
		RMSNormBackwardHalf(f16, dy, h, w, rstd, dx2, dw2, rows, cols)
		requireSameBits(t, dx1, dx2, "dx")
		requireSameBits(t, dw1, dw2, "dw")
	}
}
