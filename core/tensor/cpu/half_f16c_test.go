package cpu

import (
	"math"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"
)

// The fp16 slice conversions (F16C in the cgo build, half_f16c.c) against
// the scalar F16FromF32 and F16ToF32, bitwise, NaNs included; and the
// portable product's roundings and exactness checks against their
// definitions.

// f16Grid is every finite fp16 value, ascending, without -0.
func f16Grid() []float64 {
	var g []float64
	for h := 0; h < 1<<16; h++ {
		if v := f16Value(uint16(h)); !math.IsNaN(v) && !math.IsInf(v, 0) && h != 0x8000 {
			g = append(g, v)
		}
	}
	sort.Float64s(g)
	return g
}

// trickyF32 are float32 inputs at fp16's edges: the grid's points,
// midpoints (ties) and their neighbours from testInputs, random bit
// patterns, and NaNs of every kind, the overflow threshold, the
// subnormal range's ends and float32 subnormals, each placed both in a
// group of 8 with ordinary numbers and alone.
func trickyF32() []float32 {
	xs := testInputs(f16Grid())
	for _, u := range []uint32{
		0x7f800001, 0xff800001, 0x7fc00000, 0xffc00000, 0x7fbfffff, 0x7fffffff, 0x7f802000, 0x7fc01fff, // NaNs
		0x477fefff, 0x477ff000, 0x477ff001, 0x477fe000, 0xc77ff000, // 65504, 65520 and around
		0x387fc000, 0x387fe000, 0x387fffff, 0x38800000, // the largest subnormal half and the smallest normal
		0x33000000, 0x33000001, 0x32ffffff, 0x33800000, 0x33400000, 0x33c00000, // 2^-25, 2^-24 and ties there
		0x00000001, 0x80000001, 0x007fffff, 0x00800000, // float32 subnormals and the smallest normal
	} {
		v := math.Float32frombits(u)
		xs = append(xs, v, 1, 2, 3, 4, 5, 6, 7)
	}
	return append(xs, 0.5, 0.25) // a ragged tail
}

func TestF16SliceConversionsEveryHalf(t *testing.T) {
	if !f16c {
		t.Log("no F16C on this CPU or build: the slice conversions are the Go loops")
	}
	// every half pattern, in order (NaNs fill whole groups of 8) and
	// shifted by 3 (a NaN shares its group with numbers), plus a tail
	for _, off := range []int{0, 3} {
		h := make([]uint16, 1<<16+off+5)
		for i := range h {
			h[i] = uint16(i - off)
		}
		got := make([]float32, len(h))
		F16ToF32s(got, h)
		want := make([]float32, len(h))
		for i, v := range h {
			want[i] = F16ToF32(v)
		}
		requireSameBits(t, got, want, "F16ToF32s")

		// and back: every half's value narrows to itself, NaNs to the
		// quiet NaN of their sign
		back := make([]uint16, len(h))
		F16FromF32s(back, got)
		for i := range h {
			require.Equal(t, F16FromF32(got[i]), back[i], "F16FromF32s of %#04x", h[i])
			if f16Value(h[i]) == f16Value(h[i]) {
				require.Equal(t, h[i], back[i])
			}
		}
		require.True(t, exactHalf(true, got[off:off+0x7c00], 1, 0x7c00, 0x7c00), "the positive finite halves are fp16 values")
	}
}

func TestF16SliceConversionsTricky(t *testing.T) {
	x := trickyF32()
	h := make([]uint16, len(x))
	F16FromF32s(h, x)
	for i, v := range x {
		if want := F16FromF32(v); h[i] != want {
			t.Fatalf("F16FromF32s(bits %#08x) = %#04x, want %#04x", math.Float32bits(v), h[i], want)
		}
	}
	n := len(x)
	want := make([]float32, n)
	for i, v := range x {
		want[i] = F16ToF32(F16FromF32(v))
	}
	got := make([]float32, n)
	roundHalf(true, got, x, 1, n, n, n)
	requireSameBits(t, got, want, "roundHalf fp16")
	copy(got, x)
	RoundF16(got)
	requireSameBits(t, got, want, "RoundF16 in place")

	for i, v := range x {
		want[i] = BF16ToF32(BF16FromF32(v))
	}
	roundHalf(false, got, x, 1, n, n, n)
	requireSameBits(t, got, want, "roundHalf bf16")

	// as a matrix of rows of 37 read at stride 40 and written at stride
	// 40 (in place in a larger matrix), 37 (a dense copy, as a product's
	// operand is rounded) or 45: the rows rounded, the elements after
	// each written row left as they were; the C loops (roundHalf) and the
	// Go loops alike
	rows, cols, lds := n/45, 37, 40
	for _, ldd := range []int{40, 37, 45} {
		for _, f16 := range []bool{false, true} {
			for _, impl := range []struct {
				name  string
				round func(f16 bool, dst, src []float32, rows, cols, ldd, lds int)
			}{{"roundHalf", roundHalf}, {"roundHalfGo", roundHalfGo}} {
				got := make([]float32, rows*ldd)
				for i := range got {
					got[i] = -7
				}
				impl.round(f16, got, x, rows, cols, ldd, lds)
				for i := range got {
					w := float32(-7)
					if r, c := i/ldd, i%ldd; c < cols {
						w = BF16ToF32(BF16FromF32(x[r*lds+c]))
						if f16 {
							w = F16ToF32(F16FromF32(x[r*lds+c]))
						}
					}
					require.Equal(t, math.Float32bits(w), math.Float32bits(got[i]), "%s f16 %v, ldd %d: element %d", impl.name, f16, ldd, i)
				}
			}
		}
	}
}

// TestHalfExact holds f16Exact and bf16Exact to their definition: true
// exactly when rounding leaves every element bitwise unchanged and none
// is a NaN, whichever element (a vector group's or the tail's) breaks it.
func TestHalfExact(t *testing.T) {
	rng := newRNG(11)
	for _, f16 := range []bool{false, true} {
		exact := func(x []float32) bool { return exactHalf(f16, x, 1, len(x), len(x)) }
		round := func(x []float32) { roundHalfGo(f16, x, x, 1, len(x), len(x), len(x)) }
		x := randSlice[float32](rng, 1003, 10)
		round(x)
		require.True(t, exact(x), "f16 %v: rounded values", f16)
		// only the rows x cols at the stride count: the elements between
		// the rows are not read
		y := append([]float32(nil), x...)
		for i := 30; i < len(y); i += 32 {
			y[i], y[i+1] = float32(math.NaN()), 0.1
		}
		require.True(t, exactHalf(f16, y, 31, 30, 32), "f16 %v: between the rows", f16)
		y[5*32+7] = 0.1
		require.False(t, exactHalf(f16, y, 31, 30, 32), "f16 %v: in a row", f16)
		for _, p := range []int{0, 5, 63, 64, 500, 999, 1000, 1002} {
			for _, bad := range []float32{math.Nextafter32(x[p], 100), float32(math.NaN()), 1e-30} {
				y := append([]float32(nil), x...)
				y[p] = bad
				single := []float32{bad}
				round(single)
				want := math.Float32bits(single[0]) == math.Float32bits(bad) && bad == bad
				require.Equal(t, want, exact(y), "f16 %v: element %d set to %v", f16, p, bad)
				require.Equal(t, want, exact(y[:p+1]), "f16 %v: ending at element %d set to %v", f16, p, bad)
			}
		}
	}
}
