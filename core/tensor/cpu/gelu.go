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
// are unspecified: bitwise GeluBackward into a zeroed dx, each piece of
// dx cleared just before the kernel adds to it, while it is in cache,
// instead of in a pass of its own over memory beforehand.
func GeluBackwardFresh[T Float](x, dy, dx []T) {
	checkLen("GeluBackwardFresh", len(x), len(dy), len(dx))
	ParallelFor(len(x), elemGrain, func(lo, hi int) {
		for p := lo; p < hi; p += elemGrain {
			q := min(hi, p+elemGrain)
			clear(dx[p:q])
			geluBwd(x[p:q], dy[p:q], dx[p:q])
		}
	})
}

// GeluBackwardFreshBF16 is GeluBackwardFresh on x held as bfloat16 bits
// (an activation stored in 2 bytes for the backward), each widened
// exactly as it is read: bitwise GeluBackwardFresh on BF16ToF32s of x,
// without the widened copy.
func GeluBackwardFreshBF16(x []uint16, dy, dx []float32) {
	checkLen("GeluBackwardFreshBF16", len(x), len(dy), len(dx))
	ParallelFor(len(x), elemGrain, func(lo, hi int) {
		for p := lo; p < hi; p += elemGrain {
			q := min(hi, p+elemGrain)
			clear(dx[p:q])
			geluBwdBF16(x[p:q], dy[p:q], dx[p:q])
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
		t := math.Tanh(geluK * (v + geluA*v*v*v))
		d := 0.5*(1+t) + 0.5*v*(1-t*t)*geluK*(1+3*geluA*v*v)
		dx64[i] += dy64[i] * d
	}
}
