package cpu

import "math"

// The float32 inner loops of GELU and softmax. In the cgo build the same
// loops run as C compiled for the CPU's vector units (fastpath.c); the C
// mirrors these Go loops operation for operation (same formulas, same
// order, no fused multiply-add, sums in sumLanes fixed partial sums), so
// both builds give bitwise the same results and TestFastPathMatchesGo holds
// them to it.

// The float32 loops use the identity 0.5 (1 + tanh(u)) = sigmoid(2u):
//
//	gelu(x) = x / (1 + e^(-2u)),  u = sqrt(2/pi) (x + 0.044715 x^3),
//
// which needs one exp and one division, and unlike 1 + tanh(u) does not
// cancel for negative x, so the result keeps full relative accuracy there.
// The exp argument z is clamped so e stays a normal float32 (and 1/(1+e) too);
// where the clamp acts the result is within |x|*2e-35 of the true value,
// which is itself below 1e-33.
const geluExpMin, geluExpMax = expLo, 80

func geluFwd32Go(x, y []float32) {
	y = y[:len(x)]
	for i, v := range x {
		z := -2 * geluK * (v + geluA*v*v*v)
		if z < geluExpMin {
			z = geluExpMin
		} else if z > geluExpMax {
			z = geluExpMax
		}
		y[i] = v / (1 + expCore(z))
	}
}

// geluBwd32Go uses the sigmoid form of the derivative: with s = 1/(1+e),
// 1 - s = e*s, and
//
//	gelu'(x) = s + x s (1-s) 2 sqrt(2/pi) (1 + 3*0.044715 x^2).
func geluBwd32Go(x, dy, dx []float32) {
	dy, dx = dy[:len(x)], dx[:len(x)]
	for i, v := range x {
		dx[i] += geluBwdTerm(v, dy[i])
	}
}

// geluBwdBF16Go is geluBwd32Go on x held as bfloat16 bits, each widened
// exactly as it is read: an activation the forward stored in 2 bytes.
func geluBwdBF16Go(x []uint16, dy, dx []float32) {
	dy, dx = dy[:len(x)], dx[:len(x)]
	for i, h := range x {
		dx[i] += geluBwdTerm(BF16ToF32(h), dy[i])
	}
}

// geluBwd32SetGo is geluBwd32Go into a zeroed dx, in one pass: it stores
// 0 + the term (0 + -0 is +0, as the addition into a cleared dx gives).
func geluBwd32SetGo(x, dy, dx []float32) {
	dy, dx = dy[:len(x)], dx[:len(x)]
	for i, v := range x {
		dx[i] = 0 + geluBwdTerm(v, dy[i])
	}
}

// geluBwdBF16SetGo is geluBwdBF16Go into a zeroed dx, in one pass.
func geluBwdBF16SetGo(x []uint16, dy, dx []float32) {
	dy, dx = dy[:len(x)], dx[:len(x)]
	for i, h := range x {
		dx[i] = 0 + geluBwdTerm(BF16ToF32(h), dy[i])
	}
}

// geluBwdTerm is d * gelu'(v).
func geluBwdTerm(v, d float32) float32 {
	z := -2 * geluK * (v + geluA*v*v*v)
	if z < geluExpMin {
		z = geluExpMin
	} else if z > geluExpMax {
		z = geluExpMax
	}
	e := expCore(z)
	s := 1 / (1 + e)
	return d * s * (1 + 2*geluK*v*(1+3*geluA*v*v)*e*s)
}

// sumLanes is the number of partial sums of a softmax row: enough to keep
// vector units busy, and fixed so the result does not depend on them.
const sumLanes = 16

// softmaxRow32Go writes dst = softmax(src) and returns the row maximum and
// the sum of exp(src - max); dst may alias src. exp results below the
// smallest normal float32 are flushed to zero, so -Inf entries (masked
// logits) get probability 0.
func softmaxRow32Go(src, dst []float32) (mx, sum float32) {
	dst = dst[:len(src)]
	mx = src[0]
	for _, v := range src[1:] {
		if v > mx {
			mx = v
		}
	}
	var acc [sumLanes]float32
	full := len(src) - len(src)%sumLanes
	for i := 0; i < full; i += sumLanes {
		s, d := src[i:i+sumLanes:i+sumLanes], dst[i:i+sumLanes:i+sumLanes]
		for j := range acc {
			var e float32
			if x := s[j] - mx; x >= expLo {
				e = expCore(x)
			}
			d[j] = e
			acc[j] += e
		}
	}
	for i := full; i < len(src); i++ {
		var e float32
		if x := src[i] - mx; x >= expLo {
			e = expCore(x)
		}
		dst[i] = e
		acc[i-full] += e
	}
	sum = reduceLanes(&acc)
	inv := 1 / sum
	for i := range dst {
		dst[i] *= inv
	}
	return mx, sum
}

// softmaxRows32Go applies softmaxRow32Go to rows consecutive rows of n
// values, storing each row's maximum and sum when maxs and sums are not nil.
func softmaxRows32Go(src, dst []float32, rows, n int, maxs, sums []float32) {
	for r := 0; r < rows; r++ {
		mx, sum := softmaxRow32Go(src[r*n:(r+1)*n], dst[r*n:(r+1)*n])
		if maxs != nil {
			maxs[r], sums[r] = mx, sum
		}
	}
}

// softmaxPrefix32Go replaces row r of att (rows len(lens), row stride ld)
// with the softmax of its first lens[r] entries followed by zeros up to
// width, and stores the row's maximum and sum of exp(x - max). A row with
// no entries (lens[r] = 0) becomes zeros with maximum -Inf and sum 0.
func softmaxPrefix32Go(att []float32, ld, width int, lens []int64, maxs, sums []float32) {
	for r, n := range lens {
		row := att[r*ld : r*ld+width]
		if n > 0 {
			maxs[r], sums[r] = softmaxRow32Go(row[:n], row[:n])
		} else {
			maxs[r], sums[r] = float32(math.Inf(-1)), 0
		}
		clear(row[n:])
	}
}
