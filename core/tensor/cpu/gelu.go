package cpu

import (
	"fmt"
	"math"
)

// GELU with the tanh approximation, as in GPT-2:
//
//	gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
const (
	geluK = 0.7978845608028654 // sqrt(2/pi)
	geluA = 0.044715
)

// elemGrain is the smallest chunk worth a thread for cheap elementwise
// loops: about 20-50 µs of work, far above the cost of waking a worker.
const elemGrain = 16384

func checkLen(op string, want int, lens ...int) {
	for i, n := range lens {
		if n < want {
			panic(fmt.Sprintf("cpu.%s: argument %d has %d elements, need at least %d", op, i+1, n, want))
		}
	}
}

// GeluForward writes y = gelu(x) elementwise; y may alias x.
func GeluForward[T Float](x, y []T) {
	checkLen("GeluForward", len(x), len(y))
	if isF32[T]() {
		x32, y32 := as32(x), as32(y)
		ParallelFor(len(x), elemGrain, func(lo, hi int) { geluFwd32(x32[lo:hi], y32[lo:hi]) })
		return
	}
	x64, y64 := as64(x), as64(y)
	ParallelFor(len(x), elemGrain, func(lo, hi int) {
		y := y64[lo:hi]
		for i, v := range x64[lo:hi] {
			y[i] = 0.5 * v * (1 + math.Tanh(geluK*(v+geluA*v*v*v)))
		}
	})
}

// GeluBackward accumulates dx += dy * gelu'(x), where
//
//	gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3*0.044715 x^2),
//
// with t the tanh of the forward pass (recomputed here rather than stored,
// which costs less than the memory traffic of keeping it).
func GeluBackward[T Float](x, dy, dx []T) {
	checkLen("GeluBackward", len(x), len(dy), len(dx))
	ParallelFor(len(x), elemGrain, func(lo, hi int) { geluBwd(x[lo:hi], dy[lo:hi], dx[lo:hi]) })
}

// GeluBackwardFresh writes dx = dy * gelu'(x) into dx, whose contents
// are unspecified: bitwise GeluBackward into a zeroed dx
// (geluBackwardFreshNaive), in one pass that stores 0 + dy * gelu'(x)
// where GeluBackward adds the term to dx, instead of clearing dx first.
// The addition to zero stays: it turns a term of -0 into the +0 that
// adding it to a cleared dx gives.
func GeluBackwardFresh[T Float](x, dy, dx []T) {
	checkLen("GeluBackwardFresh", len(x), len(dy), len(dx))
	ParallelFor(len(x), elemGrain, func(lo, hi int) { geluBwdSet(x[lo:hi], dy[lo:hi], dx[lo:hi]) })
}

// geluBackwardFreshNaive is GeluBackwardFresh as two passes, each piece
// of dx cleared just before GeluBackward's kernel adds to it: the form
// the one-pass kernels are tested against.
func geluBackwardFreshNaive[T Float](x, dy, dx []T) {
	checkLen("GeluBackwardFresh", len(x), len(dy), len(dx))
	ParallelFor(len(x), elemGrain, func(lo, hi int) {
		for p := lo; p < hi; p += elemGrain {
			q := min(hi, p+elemGrain)
			clear(dx[p:q])
			geluBwd(x[p:q], dy[p:q], dx[p:q])
		}
	})
}

// GeluBackwardFreshHalf is GeluBackwardFresh on x held as 2-byte bits,
// fp16 when f16 and bfloat16 otherwise (an activation stored in 2 bytes
// for the backward), widened exactly as they are read: bitwise
// GeluBackwardFresh on the widened x, without a float32 copy of all of
// it, in one pass as GeluBackwardFresh. bfloat16 is widened element by element inside the kernel, fp16 a
// piece at a time into a scratch buffer in cache.
func GeluBackwardFreshHalf(f16 bool, x []uint16, dy, dx []float32) {
	checkLen("GeluBackwardFreshHalf", len(x), len(dy), len(dx))
	ParallelFor(len(x), elemGrain, func(lo, hi int) {
		var wide *[]float32
		if f16 {
			wide = getBuf[float32](elemGrain)
			defer putBuf(wide)
		}
		for p := lo; p < hi; p += elemGrain {
			q := min(hi, p+elemGrain)
			if f16 {
				w := (*wide)[:q-p]
				F16ToF32s(w, x[p:q])
				geluBwd32Set(w, dy[p:q], dx[p:q])
				continue
			}
			geluBwdBF16Set(x[p:q], dy[p:q], dx[p:q])
		}
	})
}

// geluBwd is GeluBackward on one chunk.
func geluBwd[T Float](x, dy, dx []T) {
	if isF32[T]() {
		geluBwd32(as32(x), as32(dy), as32(dx))
		return
	}
	x64, dy64, dx64 := as64(x), as64(dy), as64(dx)
	for i, v := range x64 {
		dx64[i] += dy64[i] * geluGrad64(v)
	}
}

// geluGrad64 is GELU's (tanh form) derivative at v.
func geluGrad64(v float64) float64 {
	t := math.Tanh(geluK * (v + geluA*v*v*v))
	return 0.5*(1+t) + 0.5*v*(1-t*t)*geluK*(1+3*geluA*v*v)
}

// geluBwdSet is geluBwd into a zeroed dx, in one pass (GeluBackwardFresh).
func geluBwdSet[T Float](x, dy, dx []T) {
	if isF32[T]() {
		geluBwd32Set(as32(x), as32(dy), as32(dx))
		return
	}
	x64, dy64, dx64 := as64(x), as64(dy), as64(dx)
	for i, v := range x64 {
		dx64[i] = 0 + dy64[i]*geluGrad64(v)
	}
}
