package cpu

import "math"

// Half-precision numbers are stored as their 16-bit patterns in uint16
// slices: bfloat16 (8 exponent bits, 7 mantissa bits: float32's range with
// 3 significant digits) and IEEE binary16, fp16 (5 exponent bits, 10
// mantissa bits: largest finite 65504, so fp16 training needs loss scaling).
// Conversions from float32 round to nearest, ties to even, as PyTorch's and
// the hardware's conversions do; NaN stays NaN (quiet), and a value past
// the largest finite half becomes an infinity of its sign. Conversions to
// float32 are exact.

// BF16FromF32 rounds f to the nearest bfloat16.
func BF16FromF32(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40 // NaN: keep the sign and top bits, set quiet
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// BF16ToF32 widens a bfloat16 to float32 (exact).
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F16FromF32 rounds f to the nearest IEEE binary16, subnormals included.
func F16FromF32(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	a := u & 0x7fffffff
	switch {
	case a > 0x7f800000:
		return sign | 0x7e00 // NaN
	case a >= 0x477ff000:
		return sign | 0x7c00 // 65520 and up (and Inf) round past 65504
	case a >= 0x38800000:
		// Normal half (at least 2^-14): rebias the exponent from 127 to
		// 15 and round the 23-bit mantissa to 10 bits; a carry out of the
		// mantissa correctly moves to the next binade.
		a -= 112 << 23
		a += 0xfff + (a>>13)&1
		return sign | uint16(a>>13)
	}
	// Subnormal half: the value is q * 2^-24 with q < 1024. With the
	// float32's significand mant (implicit bit included) and biased
	// exponent e, q = mant * 2^(e-126), a right shift by 126-e.
	e := a >> 23
	s := 126 - e
	if s >= 25 {
		return sign // below half of 2^-24 (or exactly half: ties to even 0)
	}
	mant := a&0x7fffff | 0x800000
	q := mant >> s
	rem, half := mant&(1<<s-1), uint32(1)<<(s-1)
	if rem > half || rem == half && q&1 == 1 {
		q++ // may reach 0x400, the smallest normal, which is its encoding
	}
	return sign | uint16(q)
}

// F16ToF32 widens an IEEE binary16 to float32 (exact).
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	e, m := uint32(h>>10)&0x1f, uint32(h&0x3ff)
	switch {
	case e == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | m<<13)
	case e == 0:
		v := float32(m) * (1.0 / (1 << 24)) // exact: m < 2^10
		if sign != 0 {
			return -v
		}
		return v
	}
	return math.Float32frombits(sign | (e+112)<<23 | m<<13)
}

// BF16FromF32s rounds src into dst (at least len(src) long). The bf16
// slice conversions run as vectorised C in the cgo build (fastpath.c), the
// same bits as these Go loops.
func BF16FromF32s(dst []uint16, src []float32) { bf16FromF32s(dst, src) }

func bf16FromF32sGo(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] = BF16FromF32(v)
	}
}

// BF16ToF32s widens src into dst (at least len(src) long).
func BF16ToF32s(dst []float32, src []uint16) { bf16ToF32s(dst, src) }

func bf16ToF32sGo(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] = BF16ToF32(v)
	}
}

// F16FromF32s rounds src into dst (at least len(src) long). The fp16
// slice conversions run on the F16C instructions in the cgo build
// (half_f16c.c), the same bits as these Go loops.
func F16FromF32s(dst []uint16, src []float32) { f16FromF32s(dst, src) }

func f16FromF32sGo(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] = F16FromF32(v)
	}
}

// F16ToF32s widens src into dst (at least len(src) long).
func F16ToF32s(dst []float32, src []uint16) { f16ToF32s(dst, src) }

func f16ToF32sGo(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] = F16ToF32(v)
	}
}

// RoundBF16 rounds every element of x to the nearest bfloat16 in place,
// keeping float32 storage: what a bf16 copy of x holds, widened back.
func RoundBF16(x []float32) { roundBF16(x) }

func roundBF16Go(x []float32) {
	for i, v := range x {
		x[i] = BF16ToF32(BF16FromF32(v))
	}
}

// RoundF16 rounds every element of x to the nearest fp16 in place, keeping
// float32 storage.
func RoundF16(x []float32) { roundHalf(true, x, x, 1, len(x), len(x), len(x)) }

// roundHalfGo sets the rows x cols elements at row stride ldd of dst to
// those at row stride lds of src rounded to fp16 (f16) or bfloat16,
// widened back: what the portable product reads of an operand (dst may be
// src at the same stride; the elements between the rows are left alone).
func roundHalfGo(f16 bool, dst, src []float32, rows, cols, ldd, lds int) {
	for r := 0; r < rows; r++ {
		d, s := dst[r*ldd:r*ldd+cols], src[r*lds:r*lds+cols]
		for i, v := range s {
			if f16 {
				d[i] = roundF16(v)
			} else {
				d[i] = BF16ToF32(BF16FromF32(v))
			}
		}
	}
}

// roundF16 is F16ToF32(F16FromF32(x)) computed on the float32 itself,
// which costs a fraction of the two conversions. In fp16's normal range
// the significand is rounded to 11 bits as bf16's is to 8; below it the
// float32 addition of ±0.5, whose unit in the last place is fp16's
// smallest subnormal 2^-24, rounds to a multiple of it (ties to even).
func roundF16(x float32) float32 {
	u := math.Float32bits(x)
	sign, a := u&0x80000000, u&0x7fffffff
	switch {
	case a-0x38800000 < 0x477ff000-0x38800000: // normal: 2^-14 up to 65520
		a += 0xfff + (a>>13)&1
		return math.Float32frombits(sign | a&^0x1fff)
	case a < 0x38800000: // subnormal fp16, or zero
		h := math.Float32frombits(sign | 0x3f000000) // ±0.5
		return math.Float32frombits(sign | math.Float32bits((x+h)-h)&0x7fffffff)
	case a > 0x7f800000: // NaN, quiet, as F16FromF32 makes it
		return math.Float32frombits(sign | 0x7fc00000)
	default: // 65520 and up round past 65504
		return math.Float32frombits(sign | 0x7f800000)
	}
}

// Exactness. A float32 that already holds a half value (a stored
// activation widened back, q|k|v rounded where they are made) is left
// unchanged by rounding, so a product need not round a copy of it:
// exactHalf reports whether every element of the rows x cols at stride ld
// of x is a number that rounding to fp16 (f16) or bfloat16 gives back
// bitwise (NaNs count as not exact). It stops at the first element that
// is not, which for a float32 activation is one of the first.

func exactHalfGo(f16 bool, x []float32, rows, cols, ld int) bool {
	for r := 0; r < rows; r++ {
		for _, v := range x[r*ld : r*ld+cols] {
			u := math.Float32bits(v)
			if v != v || !f16 && u&0xffff != 0 || f16 && math.Float32bits(F16ToF32(F16FromF32(v))) != u {
				return false
			}
		}
	}
	return true
}
