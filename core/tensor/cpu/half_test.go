package cpu

import (
	"math"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"
)

// nearestOf returns the element of the sorted finite grid nearest to x in
// float64, ties to the one whose bits (from bitsOf) are even; it is the
// reference the conversions are held to, computed without bit tricks.
func nearestOf(grid []float64, x float64, even func(i int) bool) int {
	i := sort.SearchFloat64s(grid, x)
	if i == 0 {
		return 0
	}
	if i == len(grid) {
		return len(grid) - 1
	}
	lo, hi := grid[i-1], grid[i]
	switch dl, dh := x-lo, hi-x; {
	case dl < dh:
		return i - 1
	case dh < dl:
		return i
	case even(i - 1):
		return i - 1
	}
	return i
}

// f16Value decodes binary16 bits by the format's definition.
func f16Value(h uint16) float64 {
	s := 1.0
	if h&0x8000 != 0 {
		s = -1
	}
	e, m := int(h>>10)&0x1f, float64(h&0x3ff)
	switch e {
	case 0x1f:
		if m != 0 {
			return math.NaN()
		}
		return s * math.Inf(1)
	case 0:
		return s * math.Ldexp(m, -24)
	}
	return s * math.Ldexp(1+m/1024, e-15)
}

// testInputs are float32 values over the whole range: random bit patterns,
// and values at and around the halves' grid points and midpoints.
func testInputs(grid []float64) []float32 {
	rng := newRNG(7)
	var xs []float32
	for range 200000 {
		xs = append(xs, math.Float32frombits(rng.Uint32()))
	}
	for i := 0; i+1 < len(grid); i++ {
		mid := float32((grid[i] + grid[i+1]) / 2)
		xs = append(xs, float32(grid[i]), mid, math.Nextafter32(mid, float32(math.Inf(1))), math.Nextafter32(mid, float32(math.Inf(-1))))
	}
	return append(xs, 0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)), math.MaxFloat32, -math.MaxFloat32)
}

func TestF16Conversion(t *testing.T) {
	// Every half pattern widens to its defined value.
	var grid []float64
	var bits []uint16
	for h := 0; h < 1<<16; h++ {
		want := f16Value(uint16(h))
		got := F16ToF32(uint16(h))
		if math.IsNaN(want) {
			require.True(t, math.IsNaN(float64(got)), "%#04x", h)
			continue
		}
		require.Equal(t, want, float64(got), "%#04x", h)
		require.Equal(t, math.Signbit(want), math.Signbit(float64(got)), "%#04x", h)
		if !math.IsInf(want, 0) && !(want == 0 && h != 0) {
			grid, bits = append(grid, want), append(bits, uint16(h))
		}
	}
	order := make([]int, len(grid))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(i, j int) bool { return grid[order[i]] < grid[order[j]] })
	sg, sb := make([]float64, len(grid)), make([]uint16, len(grid))
	for i, o := range order {
		sg[i], sb[i] = grid[o], bits[o]
	}
	// Rounding: nearest finite half, ties to even; past 65504 by half an
	// ulp (65520) or more, an infinity; NaN stays NaN.
	for _, x := range testInputs(sg) {
		got := F16FromF32(x)
		xf := float64(x)
		switch {
		case math.IsNaN(xf):
			require.True(t, math.IsNaN(float64(F16ToF32(got))), "%v", x)
		case math.Abs(xf) >= 65520:
			require.Equal(t, F16ToF32(got), float32(math.Copysign(math.Inf(1), xf)), "%v", x)
		default:
			i := nearestOf(sg, xf, func(i int) bool { return sb[i]&1 == 0 })
			want := sg[i]
			require.Equal(t, want, float64(F16ToF32(got)), "%v (bits %#x)", x, math.Float32bits(x))
			if want == 0 {
				require.Equal(t, math.Signbit(xf), got&0x8000 != 0, "sign of %v", x)
			}
		}
	}
}

func TestBF16Conversion(t *testing.T) {
	for _, x := range testInputs(nil) {
		got := BF16FromF32(x)
		xf := float64(x)
		if math.IsNaN(xf) {
			require.True(t, math.IsNaN(float64(BF16ToF32(got))), "%v", x)
			continue
		}
		// The two bf16 neighbours of x: its float32 bits truncated, and
		// one bf16 ulp further from zero (2^128 past the largest finite,
		// as IEEE rounding with an unbounded exponent has it).
		u := math.Float32bits(x)
		down := u &^ 0xffff
		e := int(down>>23) & 0xff
		lo := float64(math.Float32frombits(down))
		hi := lo + math.Copysign(math.Ldexp(1, max(e, 1)-127-7), xf)
		want := down
		if d1, d2 := math.Abs(xf-lo), math.Abs(hi-xf); d2 < d1 || d1 == d2 && (down>>16)&1 == 1 {
			want = down + 0x10000
		}
		if math.IsInf(xf, 0) {
			want = u
		}
		require.Equal(t, uint16(want>>16), got, "%v (bits %#x)", x, u)
		require.Equal(t, math.Float32frombits(want), BF16ToF32(got))
	}
	require.Equal(t, float32(math.Inf(1)), BF16ToF32(BF16FromF32(math.MaxFloat32)))
}

// TestHalfSliceConversions holds the slice conversions (vectorised C in
// the cgo build for bf16, above a length the short slices skip) to the
// scalar ones, on random values, random bit patterns (NaNs, subnormals and
// infinities among them) and a ragged tail.
func TestHalfSliceConversions(t *testing.T) {
	rng := newRNG(9)
	x := randSlice[float32](rng, 1000, 100)
	for range 3001 {
		x = append(x, math.Float32frombits(uint32(rng.Uint64())))
	}
	x = append(x, float32(math.NaN()), float32(math.Inf(-1)), math.MaxFloat32, math.Float32frombits(0x3f808000), math.Float32frombits(0x3f818000), 1e-40)
	h := make([]uint16, len(x))
	w := make([]float32, len(x))
	r := append([]float32(nil), x...)
	BF16FromF32s(h, x)
	BF16ToF32s(w, h)
	RoundBF16(r)
	for i := range x {
		require.Equal(t, BF16FromF32(x[i]), h[i])
		require.Equal(t, math.Float32bits(BF16ToF32(h[i])), math.Float32bits(w[i]))
		require.Equal(t, math.Float32bits(w[i]), math.Float32bits(r[i]))
	}
	r = append(r[:0], x...)
	F16FromF32s(h, x)
	F16ToF32s(w, h)
	RoundF16(r)
	for i := range x {
		require.Equal(t, F16FromF32(x[i]), h[i])
		require.Equal(t, math.Float32bits(F16ToF32(h[i])), math.Float32bits(w[i]))
		require.Equal(t, math.Float32bits(w[i]), math.Float32bits(r[i]))
	}
}
