package tp

import (
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// The tests of this file build each parallel layer from chunks of one
// whole layer, run it on goroutine ranks of the local backend, and hold
// its output and every gradient to the whole layer's (float64, 1e-6
// norm-wise), the way picotron tests its tensor-parallel layers.

const tol = 1e-6

// randT is a float64 tensor of normal values.
func randT(r *rand.Rand, shape ...int) *tensor.Tensor {
	t := tensor.New(tensor.Float64, shape...)
	for i := range t.F64() {
		t.F64()[i] = r.NormFloat64()
	}
	return t
}

// leaf is a copy of t that requires a gradient.
func leaf(t *tensor.Tensor) *tensor.Tensor {
	c := tensor.New(t.DType(), t.Shape()...)
	c.CopyFrom(t)
	return c.RequiresGrad()
}

// slice copies indices [lo, hi) of dimension dim of t.
func slice(t *tensor.Tensor, dim, lo, hi int) *tensor.Tensor {
	s := t.Shape()
	outer, inner := 1, 1
	for d := 0; d < dim; d++ {
		outer *= s[d]
	}
	for d := dim + 1; d < len(s); d++ {
		inner *= s[d]
	}
	shape := append([]int(nil), s...)
	shape[dim] = hi - lo
	out := tensor.New(t.DType(), shape...)
	k := (hi - lo) * inner
	for o := 0; o < outer; o++ {
		copy(out.F64()[o*k:(o+1)*k], t.F64()[(o*s[dim]+lo)*inner:(o*s[dim]+hi)*inner])
	}
	return out
}

// part is rank r's equal part of dimension dim.
func part(t *tensor.Tensor, dim, n, r int) *tensor.Tensor {
	k := t.Dim(dim) / n
	return slice(t, dim, r*k, (r+1)*k)
}

// dot is Σ y⊙w as a scalar loss.
func dot(y, w *tensor.Tensor) *tensor.Tensor { return tensor.Sum(tensor.Mul(y, w)) }

func backward(t *testing.T, loss *tensor.Tensor) {
	_, err := tensor.Backward(loss, nil, tensor.BackwardOptions{})
	require.NoError(t, err)
}

// ranks runs fn on n goroutine ranks of the local backend and returns what
// each returned, by rank (assertions happen on the test's goroutine).
func ranks[T any](t *testing.T, n int, fn func(c *Comm) (T, error)) []T {
	out := make([]T, n)
	var mu sync.Mutex
	require.NoError(t, comm.RunLocal(n, comm.Options{Timeout: 30 * time.Second}, func(g comm.Group) error {
		v, err := fn(&Comm{G: g, Alloc: tensor.NewAllocator()})
		mu.Lock()
		out[g.Rank()] = v
		mu.Unlock()
		return err
	}))
	return out
}

func near(t *testing.T, want, got *tensor.Tensor, what string) {
	t.Helper()
	require.NotNil(t, got, what)
	require.Equal(t, want.Shape(), got.Shape(), what)
	require.LessOrEqual(t, ptest.NormRel(got.Float64s(), want.Float64s()), tol, what)
}

// linearCase is one whole Linear, its input, a weight for the loss and
// the reference output and gradients.
type linearCase struct {
	x, w, b, lossW *tensor.Tensor
	y, gx, gw, gb  *tensor.Tensor
}

func newLinearCase(t *testing.T, seed int64, B, T, in, out int) linearCase {
	r := rand.New(rand.NewSource(seed))
	c := linearCase{x: randT(r, B, T, in), w: randT(r, in, out), b: randT(r, out), lossW: randT(r, B, T, out)}
	x, w, b := leaf(c.x), leaf(c.w), leaf(c.b)
	y := tensor.Linear(x, w, b)
	backward(t, dot(y, c.lossW))
	c.y, c.gx, c.gw, c.gb = y, x.Grad, w.Grad, b.Grad
	return c
}

// got is what one rank ends with.
type got struct{ y, gx, gw, gb *tensor.Tensor }

func TestColumnParallelEqualsLinear(t *testing.T) {
	const B, T, in, out = 2, 8, 6, 12
	lc := newLinearCase(t, 1, B, T, in, out)
	for _, n := range []int{2, 3, 4} {
		for _, mode := range []string{"split output", "gathered output", "sequence parallel"} {
			if mode == "sequence parallel" && T%n != 0 {
				continue
			}
			t.Run(fmt.Sprintf("%s/n%d", mode, n), func(t *testing.T) {
				rs := ranks(t, n, func(c *Comm) (got, error) {
					r := c.G.Rank()
					x := leaf(lc.x)
					if mode == "sequence parallel" {
						x = leaf(part(lc.x, 1, n, r))
					}
					l := &ColumnParallel{W: leaf(part(lc.w, 1, n, r)), B: leaf(part(lc.b, 0, n, r)), C: c,
						SP: mode == "sequence parallel", Gather: mode == "gathered output"}
					y, err := l.Forward(x, nn.Pass{})
					if err != nil {
						return got{}, err
					}
					lw := part(lc.lossW, 2, n, r)
					if l.Gather {
						lw = lc.lossW // every rank computes the whole loss
					}
					if _, err := tensor.Backward(dot(y, lw), nil, tensor.BackwardOptions{}); err != nil {
						return got{}, err
					}
					return got{y, x.Grad, l.W.Grad, l.B.Grad}, nil
				})
				for r, g := range rs {
					what := fmt.Sprintf("rank %d", r)
					if mode == "gathered output" {
						near(t, lc.y, g.y, what+" output")
					} else {
						near(t, part(lc.y, 2, n, r), g.y, what+" output")
					}
					if mode == "sequence parallel" {
						near(t, part(lc.gx, 1, n, r), g.gx, what+" input gradient")
					} else {
						near(t, lc.gx, g.gx, what+" input gradient")
					}
					near(t, part(lc.gw, 1, n, r), g.gw, what+" weight gradient")
					near(t, part(lc.gb, 0, n, r), g.gb, what+" bias gradient")
				}
			})
		}
	}
}

func TestRowParallelEqualsLinear(t *testing.T) {
	const B, T, in, out = 2, 8, 12, 6
	lc := newLinearCase(t, 2, B, T, in, out)
	for _, n := range []int{2, 3, 4} {
		for _, mode := range []string{"split input", "whole input", "sequence parallel"} {
			if mode == "sequence parallel" && T%n != 0 {
				continue
			}
			t.Run(fmt.Sprintf("%s/n%d", mode, n), func(t *testing.T) {
				rs := ranks(t, n, func(c *Comm) (got, error) {
					r := c.G.Rank()
					x := leaf(part(lc.x, 2, n, r))
					if mode == "whole input" {
						x = leaf(lc.x)
					}
					l := &RowParallel{W: leaf(part(lc.w, 0, n, r)), B: leaf(lc.b), C: c,
						SP: mode == "sequence parallel", Split: mode == "whole input"}
					y, err := l.Forward(x, nn.Pass{})
					if err != nil {
						return got{}, err
					}
					lw := lc.lossW
					if l.SP {
						lw = part(lc.lossW, 1, n, r) // this rank's part of the sequence
					}
					if _, err := tensor.Backward(dot(y, lw), nil, tensor.BackwardOptions{}); err != nil {
						return got{}, err
					}
					return got{y, x.Grad, l.W.Grad, l.B.Grad}, nil
				})
				for r, g := range rs {
					what := fmt.Sprintf("rank %d", r)
					if mode == "sequence parallel" {
						near(t, part(lc.y, 1, n, r), g.y, what+" output")
					} else {
						near(t, lc.y, g.y, what+" output")
					}
					if mode == "whole input" {
						// Each rank's gradient covers its columns only.
						want := tensor.New(tensor.Float64, lc.gx.Shape()...)
						k := in / n
						for i := 0; i < B*T; i++ {
							copy(want.F64()[i*in+r*k:i*in+(r+1)*k], lc.gx.F64()[i*in+r*k:i*in+(r+1)*k])
						}
						near(t, want, g.gx, what+" input gradient")
					} else {
						near(t, part(lc.gx, 2, n, r), g.gx, what+" input gradient")
					}
					near(t, part(lc.gw, 0, n, r), g.gw, what+" weight gradient")
					near(t, lc.gb, g.gb, what+" bias gradient")
				}
			})
		}
	}
}

// A column-parallel layer, GELU and a row-parallel layer are the MLP:
// only the row layer's reduction communicates forward.
func TestParallelMLPEqualsMLP(t *testing.T) {
	const B, T, C = 2, 4, 8
	r := rand.New(rand.NewSource(3))
	x0, w1, b1, w2, b2, lw := randT(r, B, T, C), randT(r, C, 4*C), randT(r, 4*C), randT(r, 4*C, C), randT(r, C), randT(r, B, T, C)
	x, fw, fb, pw, pb := leaf(x0), leaf(w1), leaf(b1), leaf(w2), leaf(b2)
	y := tensor.Linear(tensor.Gelu(tensor.Linear(x, fw, fb)), pw, pb)
	backward(t, dot(y, lw))
	for _, sp := range []bool{false, true} {
		const n = 2
		type res struct{ y, gx, gfw, gfb, gpw, gpb *tensor.Tensor }
		rs := ranks(t, n, func(c *Comm) (res, error) {
			k := c.G.Rank()
			in, loss := leaf(x0), lw
			if sp {
				in, loss = leaf(part(x0, 1, n, k)), part(lw, 1, n, k)
			}
			fc := &ColumnParallel{W: leaf(part(w1, 1, n, k)), B: leaf(part(b1, 0, n, k)), C: c, SP: sp}
			proj := &RowParallel{W: leaf(part(w2, 0, n, k)), B: leaf(b2), C: c, SP: sp}
			h, err := fc.Forward(in, nn.Pass{})
			if err != nil {
				return res{}, err
			}
			out, err := proj.Forward(tensor.Gelu(h), nn.Pass{})
			if err != nil {
				return res{}, err
			}
			if _, err := tensor.Backward(dot(out, loss), nil, tensor.BackwardOptions{}); err != nil {
				return res{}, err
			}
			return res{out, in.Grad, fc.W.Grad, fc.B.Grad, proj.W.Grad, proj.B.Grad}, nil
		})
		for k, g := range rs {
			what := fmt.Sprintf("sp=%v rank %d", sp, k)
			if sp {
				near(t, part(y, 1, n, k), g.y, what+" output")
				near(t, part(x.Grad, 1, n, k), g.gx, what+" input gradient")
			} else {
				near(t, y, g.y, what+" output")
				near(t, x.Grad, g.gx, what+" input gradient")
			}
			near(t, part(fw.Grad, 1, n, k), g.gfw, what+" c_fc weight gradient")
			near(t, part(fb.Grad, 0, n, k), g.gfb, what+" c_fc bias gradient")
			near(t, part(pw.Grad, 0, n, k), g.gpw, what+" c_proj weight gradient")
			near(t, pb.Grad, g.gpb, what+" c_proj bias gradient")
		}
	}
}

// Under sequence parallelism a LayerNorm sees part of the sequence; its
// weight and bias gradients, summed over the group in backward, are the
// whole LayerNorm's on every rank.
func TestSequenceParallelLayerNormEqualsLayerNorm(t *testing.T) {
	const B, T, C, n = 2, 6, 5, 3
	r := rand.New(rand.NewSource(4))
	x0, w0, b0, lw := randT(r, B, T, C), randT(r, C), randT(r, C), randT(r, B, T, C)
	x, w, b := leaf(x0), leaf(w0), leaf(b0)
	y := tensor.LayerNorm(x, w, b, nn.LayerNormEps)
	backward(t, dot(y, lw))
	rs := ranks(t, n, func(c *Comm) (got, error) {
		k := c.G.Rank()
		in := leaf(part(x0, 1, n, k))
		l := &LayerNorm{W: leaf(w0), B: leaf(b0), C: c}
		out, err := l.Forward(in, nn.Pass{})
		if err != nil {
			return got{}, err
		}
		_, err = tensor.Backward(dot(out, part(lw, 1, n, k)), nil, tensor.BackwardOptions{})
		return got{out, in.Grad, l.W.Grad, l.B.Grad}, err
	})
	for k, g := range rs {
		what := fmt.Sprintf("rank %d", k)
		near(t, part(y, 1, n, k), g.y, what+" output")
		near(t, part(x.Grad, 1, n, k), g.gx, what+" input gradient")
		near(t, w.Grad, g.gw, what+" weight gradient")
		near(t, b.Grad, g.gb, what+" bias gradient")
		require.Equal(t, rs[0].gw.F64(), g.gw.F64(), "%s: the summed gradient is the same bits on every rank", what)
	}
}

// The conjugate pairs: each op's backward is the other's forward.
func TestConjugateOps(t *testing.T) {
	const n = 2
	r := rand.New(rand.NewSource(5))
	parts := []*tensor.Tensor{randT(r, 2, 3, 4), randT(r, 2, 3, 4)}
	whole := tensor.New(tensor.Float64, 2, 6, 4)
	sum := tensor.New(tensor.Float64, 2, 3, 4)
	for k, p := range parts {
		for b := 0; b < 2; b++ {
			copy(whole.F64()[b*24+k*12:b*24+(k+1)*12], p.F64()[b*12:(b+1)*12])
		}
		for i, v := range p.F64() {
			sum.F64()[i] += v
		}
	}
	type res struct{ gathered, gradOfGather, reduced, gradOfReduce, scattered *tensor.Tensor }
	rs := ranks(t, n, func(c *Comm) (res, error) {
		k := c.G.Rank()
		var out res
		x := leaf(parts[k])
		y, err := c.GatherSeq(x)
		if err != nil {
			return out, err
		}
		out.gathered = y
		// Each rank's gradient of the gathered sequence is a partial
		// sum: backward reduce-scatters it.
		if _, err := tensor.Backward(dot(y, whole), nil, tensor.BackwardOptions{}); err != nil {
			return out, err
		}
		out.gradOfGather = x.Grad
		x = leaf(parts[k])
		if out.reduced, err = c.Reduce(x); err != nil {
			return out, err
		}
		if _, err := tensor.Backward(dot(out.reduced, parts[0]), nil, tensor.BackwardOptions{}); err != nil {
			return out, err
		}
		out.gradOfReduce = x.Grad
		out.scattered, err = c.ScatterSeq(leaf(whole))
		return out, err
	})
	for k, g := range rs {
		near(t, whole, g.gathered, "gathered")
		want := tensor.New(tensor.Float64, 2, 3, 4)
		for i := range want.F64() {
			want.F64()[i] = n * part(whole, 1, n, k).F64()[i]
		}
		near(t, want, g.gradOfGather, "reduce-scattered gradient of the gathered sequence")
		near(t, sum, g.reduced, "reduced")
		near(t, parts[0], g.gradOfReduce, "the reduction's gradient passes unchanged")
		want = part(whole, 1, n, k)
		for i := range want.F64() {
			want.F64()[i] *= n
		}
		near(t, want, g.scattered, "scattered sum")
	}
}
