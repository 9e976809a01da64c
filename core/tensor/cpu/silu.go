package cpu

import "math"

// SwiGLU's activation, silu(gate)·up, for Llama's MLP. x holds rows of
// [gate | up], I numbers each (stride 2I); y and dy hold rows of I.
//
//	y  = silu(g)·u,          silu(g) = g·s,  s = sigmoid(g) = 1/(1 + e^-g)
//	dg = dy·u·s·(1 + g·(1 - s))
//	du = dy·g·s
//
// float64 runs the formulas with math.Exp. float32 runs them in float32
// with expCore (the softmax's exponential, within 1.2e-7 relative of e^x) on
// -g clamped to [geluExpMin, geluExpMax], as GELU's sigmoid form does:
// past the clamp s is 1 to float32's precision (g > 87.3) or below 2e-35
// (g < -80), where silu(g) is then off by less than |g|·2e-35.
// The C loops of the cgo build (fastpath.c) are the Go loops below,
// operation for operation, so every build gives the same bits.

// SiluMulForward sets y to silu(gate)·up, row by row.
func SiluMulForward[T Float](x, y []T, rows, I int) {
	checkLen("SiluMulForward", 2*rows*I, len(x))
	checkLen("SiluMulForward", rows*I, len(y))
	grain := max(1, elemGrain/max(1, I))
	if isF32[T]() {
		x32, y32 := as32(x), as32(y)
		ParallelFor(rows, grain, func(lo, hi int) { siluMulFwd32(x32[2*lo*I:2*hi*I], y32[lo*I:hi*I], hi-lo, I) })
		return
	}
	x64, y64 := as64(x), as64(y)
	ParallelFor(rows, grain, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			g, u, o := x64[r*2*I:r*2*I+I], x64[r*2*I+I:(r+1)*2*I], y64[r*I:(r+1)*I]
			for i := range o {
				a := g[i]
				o[i] = a / (1 + math.Exp(-a)) * u[i]
			}
		}
	})
}

// SiluMulBackward sets dx (rows of [d gate | d up], the layout of x) to
// the gradient of SiluMulForward's y given dy.
func SiluMulBackward[T Float](x, dy, dx []T, rows, I int) {
	checkLen("SiluMulBackward", 2*rows*I, len(x), len(dx))
	checkLen("SiluMulBackward", rows*I, len(dy))
	grain := max(1, elemGrain/max(1, I))
	if isF32[T]() {
		x32, dy32, dx32 := as32(x), as32(dy), as32(dx)
		ParallelFor(rows, grain, func(lo, hi int) {
			siluMulBwd32(x32[2*lo*I:2*hi*I], dy32[lo*I:hi*I], dx32[2*lo*I:2*hi*I], hi-lo, I)
		})
		return
	}
	x64, dy64, dx64 := as64(x), as64(dy), as64(dx)
	ParallelFor(rows, grain, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			g, u := x64[r*2*I:r*2*I+I], x64[r*2*I+I:(r+1)*2*I]
			dg, du, d := dx64[r*2*I:r*2*I+I], dx64[r*2*I+I:(r+1)*2*I], dy64[r*I:(r+1)*I]
			for i := range d {
				a, b, e := g[i], u[i], d[i]
				s := 1 / (1 + math.Exp(-a))
				dg[i] = e * b * s * (1 + a*(1-s))
				du[i] = e * a * s
			}
		}
	})
}

// SiluMulBackwardHalf is SiluMulBackward (float32) on x held as 2-byte
// bits, fp16 when f16 and bfloat16 otherwise (an activation stored in 2
// bytes for the backward): each chunk of rows is widened exactly into a
// scratch buffer, in cache, just before the loop reads it, so the result
// is bitwise that on the widened x.
func SiluMulBackwardHalf(f16 bool, x []uint16, dy, dx []float32, rows, I int) {
	checkLen("SiluMulBackwardHalf", 2*rows*I, len(x), len(dx))
	checkLen("SiluMulBackwardHalf", rows*I, len(dy))
	step := max(1, elemGrain/max(1, 2*I)) // rows widened at a time
	ParallelFor(rows, max(1, elemGrain/max(1, I)), func(lo, hi int) {
		wide := getBuf[float32](2 * min(step, hi-lo) * I)
		defer putBuf(wide)
		for r0 := lo; r0 < hi; r0 += step {
			r1 := min(hi, r0+step)
			xs := (*wide)[:2*(r1-r0)*I]
			widenHalfs(f16, xs, x[2*r0*I:2*r1*I])
			siluMulBwd32(xs, dy[r0*I:r1*I], dx[2*r0*I:2*r1*I], r1-r0, I)
		}
	})
}

// siluExp is e^-g for the float32 loops, its exponent clamped.
func siluExp(g float32) float32 {
	z := -g
	if z < geluExpMin {
		z = geluExpMin
	} else if z > geluExpMax {
		z = geluExpMax
	}
	return expCore(z)
}

func siluMulFwd32Go(x, y []float32, rows, I int) {
	for r := 0; r < rows; r++ {
		g, u, o := x[r*2*I:r*2*I+I], x[r*2*I+I:(r+1)*2*I], y[r*I:(r+1)*I]
		for i := range o {
			a := g[i]
			o[i] = a / (1 + siluExp(a)) * u[i]
		}
	}
}

func siluMulBwd32Go(x, dy, dx []float32, rows, I int) {
	for r := 0; r < rows; r++ {
		g, u := x[r*2*I:r*2*I+I], x[r*2*I+I:(r+1)*2*I]
		dg, du, d := dx[r*2*I:r*2*I+I], dx[r*2*I+I:(r+1)*2*I], dy[r*I:(r+1)*I]
		for i := range d {
			a, b, e := g[i], u[i], d[i]
			s := 1 / (1 + siluExp(a))
			dg[i] = e * b * s * (1 + a*(1-s))
			du[i] = e * a * s
		}
	}
}
