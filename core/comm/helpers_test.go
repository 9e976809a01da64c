package comm

import (
	"bytes"
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
// float64, then rounded to dt the way the collective finishes Avg.
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
			case tensor.Float32:
				acc = float64(float32(acc) / float32(nranks))
			default:
				acc /= float64(nranks)
			}
		}
		out[i] = acc
	}
	return out
}
