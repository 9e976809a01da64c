package comm

import (
	"bytes"
	"math"
	"sync"
	"testing"

	"github.com/tinyacc/tinyacc/core/tensor"
)

const testToken = "test-job-token"

// runner runs fn on n ranks of one backend.
type runner func(t *testing.T, n int, opts Options, fn func(g Group) error) error

var backendRunners = map[string]runner{
	"local": func(_ *testing.T, n int, opts Options, fn func(g Group) error) error {
		return RunLocal(n, opts, fn)
	},
	"tcp": runTCP,
}

// runTCP starts n tcp ranks as goroutines of this process, each with its own
// listener and store connection over loopback, like n processes would.
func runTCP(t *testing.T, n int, opts Options, fn func(g Group) error) error {
	t.Helper()
	return RunTCPLocal(n, opts, fn)
}

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// val is the test input of element i on rank r: small integers, so float32
// sums over a few ranks are exact and any reduction order gives the same
// bits as the float64 reference.
func val(r, i int) float64 {
	return float64(((r+1)*7919+i*104729)%201 - 100)
}

func filled(dt tensor.DType, r, n int, shift int) *tensor.Tensor {
	t := tensor.Default.New(tensor.Comm, dt, n)
	for i := range n {
		t.Set(i, val(r, i+shift))
	}
	return t
}

// refReduce is the serial reference: element i reduced over ranks in
// float64, then rounded to dt the way the collective finishes Avg. The
// sums are exact in float64 and in float32, so for half dtypes the
// reference is the rule of half.go computed independently: the exact sum
// (divided in float32 for Avg) rounded once by roundHalfRef.
func refReduce(dt tensor.DType, op ReduceOp, nranks, n, shift int) []float64 {
	out := make([]float64, n)
	for i := range n {
		acc := val(0, i+shift)
		for r := 1; r < nranks; r++ {
			v := val(r, i+shift)
			switch op {
			case Sum, Avg:
				acc += v
			case Max:
				acc = max(acc, v)
			case Min:
				acc = min(acc, v)
			}
		}
		if op == Avg {
			switch dt {
			case tensor.Float32, tensor.BFloat16, tensor.Float16:
				acc = float64(float32(acc) / float32(nranks))
			default:
				acc /= float64(nranks)
			}
		}
		if dt == tensor.BFloat16 || dt == tensor.Float16 {
			acc = roundHalfRef(dt, acc)
		}
		out[i] = acc
	}
	return out
}

// halfDTypes are the half-precision dtypes every backend's tables add.
var halfDTypes = []tensor.DType{tensor.BFloat16, tensor.Float16}

// roundHalfRef rounds x to the nearest bfloat16 or float16, ties to even,
// by scaling to the format's last place (8 significant bits for bf16; 11
// for fp16, whose last place never goes below the subnormal 2^-24), written
// apart from the conversions under test. Values stay far from overflow.
func roundHalfRef(dt tensor.DType, x float64) float64 {
	if x == 0 {
		return 0
	}
	_, e := math.Frexp(x) // |x| = m * 2^e, m in [0.5, 1)
	bits, minQ := 8, math.Inf(-1)
	if dt == tensor.Float16 {
		bits, minQ = 11, math.Ldexp(1, -24)
	}
	q := math.Max(math.Ldexp(1, e-bits), minQ)
	return math.RoundToEven(x/q) * q
}
