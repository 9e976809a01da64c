package cpu

import (
	"fmt"
	"math"
	"testing"
)

// halfInputs is x with values that round up, down, to even, overflow
// fp16 and are not numbers.
func halfInputs(n int) []float32 {
	x := randSlice[float32](newRNG(71), n, 8)
	special := []float32{0, float32(math.Copysign(0, -1)), 1e-30, 65519, 70000, -70000,
		float32(math.Inf(1)), float32(math.NaN()), math.Float32frombits(0x3f808000), math.Float32frombits(0x3f818000)}
	for i, v := range special {
		x[i*37%n] = v
	}
	return x
}

// requireSameU16 fails unless got and want hold the same bits.
func requireSameU16(t *testing.T, got, want []uint16, what string) {
	t.Helper()
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%s: element %d: %#04x, want %#04x", what, i, got[i], want[i])
		}
	}
}

// garbage16 is n 2-byte elements of garbage.
func garbage16(n int) []uint16 {
	h := make([]uint16, n)
	for i := range h {
		h[i] = uint16(i*7919 + 13)
	}
	return h
}

// GeluForwardHalf is bitwise GeluForward followed by rounding x and y,
// for bf16 and fp16, each copy wanted or not, on several pieces per
// thread and a ragged tail, for every thread count.
func TestGeluForwardHalf(t *testing.T) {
	n := 2*elemGrain + 3*halfPiece + 17
	x := halfInputs(n)
	for _, f16 := range []bool{false, true} {
		wy, wx, wh := garbage[float32](n), garbage16(n), garbage16(n)
		geluForwardHalfNaive(f16, x, wy, wx, wh)
		for _, th := range []int{1, 2, 3} {
			for _, want := range [][2]bool{{true, true}, {true, false}, {false, true}} {
				withThreads(th, func() {
					what := fmt.Sprintf("f16=%v threads=%d copies=%v", f16, th, want)
					y := garbage[float32](n)
					var hx, hy []uint16
					if want[0] {
						hx = garbage16(n)
					}
					if want[1] {
						hy = garbage16(n)
					}
					GeluForwardHalf(f16, x, y, hx, hy)
					requireSameBits(t, y, wy, what+" y")
					if hx != nil {
						requireSameU16(t, hx, wx, what+" x's copy")
					}
					if hy != nil {
						requireSameU16(t, hy, wh, what+" y's copy")
					}
				})
			}
		}
	}
}

// finiteHalfInputs is halfInputs with 3 in place of the infinities and
// NaNs: rows of finite values, whose statistics stay numbers.
func finiteHalfInputs(n int) []float32 {
	x := halfInputs(n)
	for i := range x {
		if math.IsInf(float64(x[i]), 0) || math.IsNaN(float64(x[i])) {
			x[i] = 3
		}
	}
	return x
}

// LayerNormForwardHalf is bitwise LayerNormForward followed by rounding
// x and y, for bf16 and fp16, widths that do and do not divide a piece,
// for every thread count.
func TestLayerNormForwardHalf(t *testing.T) {
	for _, cols := range []int{7, 256, 301, 5000} {
		rows := 67
		x := finiteHalfInputs(rows * cols)
		w, b := randSlice[float32](newRNG(72), cols, 1), randSlice[float32](newRNG(73), cols, 1)
		for _, f16 := range []bool{false, true} {
			wy, wm, wr := garbage[float32](rows*cols), garbage[float32](rows), garbage[float32](rows)
			wx, wh := garbage16(rows*cols), garbage16(rows*cols)
			layerNormForwardHalfNaive(f16, x, w, b, wy, wm, wr, rows, cols, 1e-5, wx, wh)
			for _, th := range []int{1, 2, 3} {
				withThreads(th, func() {
					what := fmt.Sprintf("cols=%d f16=%v threads=%d", cols, f16, th)
					y, m, r := garbage[float32](rows*cols), garbage[float32](rows), garbage[float32](rows)
					hx, hy := garbage16(rows*cols), garbage16(rows*cols)
					LayerNormForwardHalf(f16, x, w, b, y, m, r, rows, cols, 1e-5, hx, hy)
					requireSameBits(t, y, wy, what+" y")
					requireSameBits(t, m, wm, what+" mean")
					requireSameBits(t, r, wr, what+" rstd")
					requireSameU16(t, hx, wx, what+" x's copy")
					requireSameU16(t, hy, wh, what+" y's copy")
				})
			}
		}
	}
}

// RMSNormForwardHalf is bitwise the forward followed by the narrowing of
// its input and output, whatever the thread count, at widths below,
// at and past a piece of rows.
func TestRMSNormForwardHalf(t *testing.T) {
	for _, cols := range []int{7, 256, 301, 5000} {
		rows := 67
		x := finiteHalfInputs(rows * cols)
		w := randSlice[float32](newRNG(74), cols, 1)
		for _, f16 := range []bool{false, true} {
			wy, wr := garbage[float32](rows*cols), garbage[float32](rows)
			wx, wh := garbage16(rows*cols), garbage16(rows*cols)
			rmsNormForwardHalfNaive(f16, x, w, wy, wr, rows, cols, 1e-5, wx, wh)
			for _, th := range []int{1, 2, 3} {
				withThreads(th, func() {
					what := fmt.Sprintf("cols=%d f16=%v threads=%d", cols, f16, th)
					y, r := garbage[float32](rows*cols), garbage[float32](rows)
					hx, hy := garbage16(rows*cols), garbage16(rows*cols)
					RMSNormForwardHalf(f16, x, w, y, r, rows, cols, 1e-5, hx, hy)
					requireSameBits(t, y, wy, what+" y")
					requireSameBits(t, r, wr, what+" rstd")
					requireSameU16(t, hx, wx, what+" x's copy")
					requireSameU16(t, hy, wh, what+" y's copy")
				})
			}
		}
	}
}

// RoundHalfInto is bitwise rounding in place followed by the narrowing
// of the rounded values.
func TestRoundHalfInto(t *testing.T) {
	n := 1<<17 + 3*halfPiece + 5
	for _, f16 := range []bool{false, true} {
		want := halfInputs(n)
		wh := make([]uint16, n)
		if f16 {
			RoundF16(want)
		} else {
			RoundBF16(want)
		}
		narrowHalf(f16, wh, want)
		for _, th := range []int{1, 2, 3} {
			withThreads(th, func() {
				x, h := halfInputs(n), garbage16(n)
				RoundHalfInto(f16, x, h)
				requireSameBits(t, x, want, fmt.Sprintf("f16=%v threads=%d rounded", f16, th))
				requireSameU16(t, h, wh, fmt.Sprintf("f16=%v threads=%d copy", f16, th))
			})
		}
	}
}

// The bfloat16 rounding that writes past the caches is bitwise
// BF16FromF32s (the C loop and the Go one) on every start and length
// around a cache line, ties, NaNs with payloads, infinities and
// subnormals.
func TestBF16FromF32sStream(t *testing.T) {
	src := halfInputs(3000)
	src[100] = math.Float32frombits(0x7f800001) // a NaN whose payload rounding would carry
	src[101] = math.Float32frombits(0xffffffff)
	src[102] = math.Float32frombits(0x00000001)
	src[103] = math.Float32frombits(0x7f7fffff)
	want := make([]uint16, len(src))
	bf16FromF32sGo(want, src)
	for _, lo := range []int{0, 1, 31, 32, 33} {
		for _, n := range []int{0, 255, 256, 257, 1000, 2967 - lo} {
			dst := garbage16(len(src))
			bf16FromF32sStream(dst[lo:lo+n], src[lo:lo+n])
			requireSameU16(t, dst[lo:lo+n], want[lo:lo+n], fmt.Sprintf("from %d, %d elements", lo, n))
		}
	}
}
