package tensor

import (
	"math/rand"
	"testing"

	"github.com/stretchr/testify/require"
)

// recomputeNet is two pre-LayerNorm residual blocks (LayerNorm, Linear,
// GELU, Linear) and a sum of squares, in float64 on allocator a.
type recomputeNet struct {
	a      *Allocator
	params []*Tensor
}

func newRecomputeNet(a *Allocator, C int) *recomputeNet {
	r := rand.New(rand.NewSource(7))
	n := &recomputeNet{a: a}
	p := func(shape ...int) *Tensor {
		t := a.New(Params, Float64, shape...)
		for i := range t.f64 {
			t.f64[i] = r.NormFloat64() * 0.3
		}
		n.params = append(n.params, t.RequiresGrad())
		return t
	}
	for range 2 {
		p(C)
		p(C)
		p(C, 2*C)
		p(2 * C)
		p(2*C, C)
		p(C)
	}
	return n
}

// block is block i on x; drop, when set, drops the LayerNorm's and GELU's
// outputs after the block's forward (selective recomputation), through a
// view of the LayerNorm output as a tensor-parallel copy would hand it on.
func (n *recomputeNet) block(i int, x *Tensor, drop bool) *Tensor {
	w := n.params[6*i : 6*i+6]
	h := LayerNorm(x, w[0], w[1], 1e-5)
	v := View(h, h.Shape()...)
	g := Gelu(Linear(v, w[2], w[3]))
	y := Add(x, Linear(g, w[4], w[5]))
	if drop {
		Drop(h)
		Drop(g)
	}
	return y
}

const (
	plain = iota
	selective
	full
)

// run is one forward and backward; it returns the loss, the parameters'
// gradients, the order GradReady fired in and the activation bytes alive
// after the forward.
func (n *recomputeNet) run(t *testing.T, x *Tensor, mode int, deferW bool) (loss float64, grads [][]float64, order []int, held int64) {
	for _, p := range n.params {
		p.Grad = nil
	}
	start := n.a.Usage().Current[Activations]
	x = x.Detach().RequiresGrad()
	for i := range 2 {
		if mode == full {
			var err error
			x, err = Checkpoint("block", x, func(x *Tensor, rerun bool) (*Tensor, error) { return n.block(i, x, false), nil })
			require.NoError(t, err)
		} else {
			x = n.block(i, x, mode == selective)
		}
	}
	l := Sum(Mul(x, x))
	held = n.a.Usage().Current[Activations] - start
	index := map[*Tensor]int{}
	for i, p := range n.params {
		index[p] = i
	}
	d, err := Backward(l, nil, BackwardOptions{Release: true, Alloc: n.a, DeferWeightGrads: deferW,
		GradReady: func(p *Tensor, _ PassInfo) {
			// The input's gradient is final when its block's backward is
			// done; with a checkpoint, that is after the block's
			// parameters'. Parameters fire in the same order.
			if i, ok := index[p]; ok {
				order = append(order, i)
			}
		}})
	require.NoError(t, err)
	d.Run()
	for _, p := range n.params {
		grads = append(grads, append([]float64(nil), p.Grad.f64...))
	}
	return l.At(0), grads, order, held
}

func recomputeInput(a *Allocator, B, T, C int) *Tensor {
	r := rand.New(rand.NewSource(3))
	x := a.New(Activations, Float64, B, T, C)
	for i := range x.f64 {
		x.f64[i] = r.NormFloat64()
	}
	return x
}

// TestRecomputeBitwise: full (Checkpoint) and selective (Drop) give the
// same loss, the same gradients bit for bit and the same GradReady order of the parameters
// as keeping everything, with and without deferred weight gradients.
func TestRecomputeBitwise(t *testing.T) {
	const B, T, C = 2, 3, 8
	for _, deferW := range []bool{false, true} {
		a := NewAllocator()
		n := newRecomputeNet(a, C)
		x := recomputeInput(a, B, T, C)
		wantLoss, wantGrads, wantOrder, _ := n.run(t, x, plain, deferW)
		for _, mode := range []int{selective, full} {
			loss, grads, order, _ := n.run(t, x, mode, deferW)
			require.Equal(t, wantLoss, loss, "mode %d defer %v", mode, deferW)
			require.Equal(t, wantGrads, grads, "mode %d defer %v", mode, deferW)
			require.Equal(t, wantOrder, order, "mode %d defer %v", mode, deferW)
		}
	}
}

// TestRecomputeKeepsLess: after the forward, a checkpointed block holds
// only its input and output, and selective holds the plain run's bytes
// less the dropped LayerNorm and GELU outputs.
func TestRecomputeKeepsLess(t *testing.T) {
	const B, T, C = 2, 3, 8
	a := NewAllocator()
	n := newRecomputeNet(a, C)
	x := recomputeInput(a, B, T, C)
	_, _, _, plainHeld := n.run(t, x, plain, false)
	_, _, _, selHeld := n.run(t, x, selective, false)
	_, _, _, fullHeld := n.run(t, x, full, false)
	act := int64(8 * B * T * C) // one [B, T, C] float64 activation
	// Two blocks' outputs and the loss's square and sum stay in all runs;
	// full keeps nothing else.
	require.Equal(t, 2*act+act+8, fullHeld)
	// Per block: LayerNorm output and GELU output (2C wide) dropped.
	require.Equal(t, plainHeld-2*(act+2*act), selHeld)
}
