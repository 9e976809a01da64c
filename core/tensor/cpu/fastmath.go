package cpu

import "math"

// float32 exp for the training path. Package math only offers float64
// routines, and calling math.Exp per element would dominate the softmax,
// cross-entropy and GELU kernels. expCore is accurate to 1.2e-7 relative
// (about one float32 ulp, checked against float64 math in the tests), the
// rounding level of float32 training anyway. (GELU needs tanh, but as
// 0.5(1+tanh(u)) = 1/(1+exp(-2u)), so exp is the only transcendental the
// float32 kernels evaluate.)

const (
	expLo = -87.33654 // below: the result is not a normal float32 (callers flush to 0)
	expHi = 88.72283  // above: the result overflows
)

// expCore computes e^x for x in [expLo, expHi] as 2^n * e^r, with
// n = round(x/ln2), |r| <= ln2/2, e^r from a degree-6 polynomial whose
// coefficients were fitted to minimise the maximum relative error on that
// interval, and 2^n added straight into the exponent bits. It is small
// enough to inline; callers clamp its argument.
func expCore(x float32) float32 {
	const (
		log2e = 1.4426950408889634
		ln2hi = 0.693359375 // few mantissa bits, so n*ln2hi is exact
		ln2lo = -2.12194440e-4
		magic = 12582912 // 1.5*2^23: adding it rounds to an integer
		c2    = 0.49999991059303284
		c3    = 0.16666419804096222
		c4    = 0.04166822507977486
		c5    = 0.008374815806746483
		c6    = 0.0013836829457432032
	)
	t := x*log2e + magic
	n := t - magic
	r := x - n*ln2hi
	r -= n * ln2lo
	p := (((((c6*r+c5)*r+c4)*r+c3)*r+c2)*r+1)*r + 1
	// The low mantissa bits of t hold n (two's complement, offset by magic's
	// bits, which vanish when shifted into the exponent field).
	return math.Float32frombits(math.Float32bits(p) + math.Float32bits(t)<<23)
}
