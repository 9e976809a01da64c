package tensor

import "fmt"

// Activation recomputation trades compute for memory in two ways.
//
// Selective (Drop): an op whose output is cheap to form again from what
// its backward keeps anyway (a LayerNorm from its input and statistics,
// GELU from its input, the attention core from q|k|v) registers a refill
// function on its node. Drop gives such an output's storage back to the
// allocator once the forward no longer reads it; the backward forms it
// again, with the same kernel and so bitwise the same values, just before
// the first op backward that reads it (the producing op's own, or a
// consumer's that received the tensor or a view of it), and gives it back
// once the producing op's backward, its last reader, is done (unless
// weight gradients are deferred: they read it later). No matrix product
// of a Linear is repeated.
//
// Full (Checkpoint): a function of one input (a transformer block) keeps
// only that input. Its forward runs as usual and every buffer it made but
// its output is released at once; the backward runs the function's
// forward again on the kept input and then its backward, inside the same
// pass, so gradients reach the same leaves in the same order, fire the
// same GradReady callbacks and are summed the same way as without
// recomputation: the result is bitwise the same.

// Drop gives t's storage back to its allocator until the backward needs t
// again, and reports whether it did: only the output of an op that can
// form it again (LayerNorm, Gelu, the whole-sequence attention), owning
// its storage, is dropped. t and its views must not be read by a forward
// after; the backward refills them before any op backward reads them.
func Drop(t *Tensor) bool {
	if t == nil || t.node == nil || t.node.refill == nil || t.alloc == nil || t.dropped {
		return false
	}
	t.Release()
	t.dropped = true
	t.dropView()
	return true
}

// Discard gives t's storage back for good, and reports whether it did:
// only the output of an op whose backward does not read it (a Linear,
// an Add), owning its storage, is discarded. The caller vouches for the
// rest: the forward has no more use for t, and none of t's consumers
// reads it in its backward (an Add, which reads none of its inputs, is a
// residual projection's only consumer). A reader of t or a view of it
// finds no storage instead of a reused buffer.
func Discard(t *Tensor) bool {
	if t == nil || t.node == nil || !t.node.outUnread || t.alloc == nil || t.dropped {
		return false
	}
	t.Release()
	t.dropView()
	return true
}

// dropView points t's views at no storage, so a read of a dropped
// activation through a view fails instead of reading a reused buffer.
func (t *Tensor) dropView() {
	for _, v := range t.views {
		v.f32, v.f64, v.i32 = nil, nil, nil
	}
}

// Dropped reports whether t (or the activation t is a view of) is waiting
// for its refill.
func (t *Tensor) Dropped() bool {
	if t.base != nil {
		return t.base.dropped
	}
	return t.dropped
}

// refill forms a dropped activation again (t itself or the one t views),
// or widens one stored in its compute dtype (StoreHalf).
func refill(t *Tensor) {
	if t == nil {
		return
	}
	if t.base != nil {
		t = t.base
	}
	if t.stored() {
		widen(t) // precision.go
		return
	}
	if !t.dropped {
		return
	}
	// The refill reads the node's inputs: those stored in 2 bytes are
	// widened first.
	for _, in := range t.node.inputs {
		refill(in)
	}
	a := t.home
	if a == nil {
		a = Default
	}
	n := a.NewUninit(t.cat, t.dtype, t.shape...)
	t.f32, t.f64, t.i32, t.alloc = n.f32, n.f64, n.i32, a
	t.dropped, t.refilled = false, true
	for _, v := range t.views {
		v.f32, v.f64, v.i32 = t.f32, t.f64, t.i32
	}
	t.node.refill(t)
}

// leafUse is a leaf reached from a checkpointed function's output and the
// number of edges that reach it.
type leafUse struct {
	t *Tensor
	n int
}

// Checkpoint runs fn on x and keeps, for the backward, only x: every other
// buffer fn's forward made is released when it returns. The backward calls
// fn again with rerun set, on a tensor sharing x's storage, and runs the
// new graph's backward within the same pass (see the comment above): fn
// must compute bitwise the same thing both times (same kernels; tinyacc's
// model draws no random numbers in forward) and reach the same leaves (the
// same parameters) both times; a rerun that reaches others fails the
// backward. A collective inside fn runs again in the rerun, in the
// backward's order, which is the same on every rank. The name labels the
// op in errors.
func Checkpoint(name string, x *Tensor, fn func(x *Tensor, rerun bool) (*Tensor, error)) (*Tensor, error) {
	in := x.Detach()
	in.requiresGrad = x.requiresGrad
	y, err := fn(in, false)
	if err != nil {
		return nil, err
	}
	if !y.requiresGrad || y.node == nil {
		return y, nil
	}
	order := topo(y)
	leaves := countLeaves(order, in)
	// out takes over y's storage (y may be a view of a tensor of the
	// graph, a module hook's); everything else of the graph goes.
	out := y.Reshape(y.shape...)
	out.base, out.views = nil, nil
	for _, t := range append(order, y) {
		if t.alloc != nil && sameStorage(t, y) {
			out.alloc, t.alloc = t.alloc, nil
		}
	}
	for _, t := range order {
		t.Release()
		for _, s := range t.node.saved {
			s.Release()
		}
		t.node = nil
	}
	op := "checkpoint:" + name
	out.requiresGrad = true
	out.node = &node{op: op, leaves: leaves, backward: func(b *Backprop, g *Tensor) []*Tensor {
		in := x.Detach()
		in.requiresGrad = x.requiresGrad
		y, err := fn(in, true)
		if err != nil {
			panic(&FunctionError{Op: op, Err: fmt.Errorf("recomputing the forward: %w", err)})
		}
		if !y.requiresGrad || y.node == nil {
			panic(&FunctionError{Op: op, Err: fmt.Errorf("the recomputed forward recorded no graph")})
		}
		order := topo(y)
		for _, t := range order {
			t.dropEarly() // StoreHalf keeps nothing of a rerun (early.go)
		}
		if again := countLeaves(order, in); !sameLeaves(again, leaves) {
			panic(&FunctionError{Op: op, Err: fmt.Errorf("the recomputed forward reached %d parameters, the forward %d: it must compute the same thing both times", len(again), len(leaves))})
		}
		return []*Tensor{b.nested(order, y, g, in)}
	}}
	if x.requiresGrad {
		out.node.inputs = []*Tensor{x}
	} else {
		out.node.inputs = []*Tensor{nil}
	}
	return out, nil
}

// countLeaves lists the leaves the nodes of order reach, but skip, with
// the number of edges to each, in first-reached order.
func countLeaves(order []*Tensor, skip *Tensor) []leafUse {
	var out []leafUse
	at := map[*Tensor]int{}
	for _, t := range order {
		for _, in := range t.node.inputs {
			if in == nil || in.node != nil || in == skip {
				continue
			}
			i, ok := at[in]
			if !ok {
				i = len(out)
				at[in] = i
				out = append(out, leafUse{t: in})
			}
			out[i].n++
		}
	}
	return out
}

func sameLeaves(a, b []leafUse) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
