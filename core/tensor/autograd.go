package tensor

import (
	"fmt"
)

// The autograd is define-by-run: every op whose inputs require a gradient
// records a node on its output. There is no global tape; a graph is whatever
// is reachable from the tensor Backward starts at, so several graphs (one per
// pipeline micro-batch, say) can be alive at once and be run in any order.
//
// Backward visits nodes in one deterministic order that depends only on the
// order ops were recorded, never on timing, so collectives started from
// hooks during backward line up on every rank.

// node is the record of one op application.
type node struct {
	op     string
	inputs []*Tensor // nil entries for inputs that need no gradient
	// backward receives the gradient of the output and returns one gradient
	// per input (nil where none flows).
	backward func(b *Backprop, gout *Tensor) []*Tensor
	// saved are op-private buffers (e.g. attention statistics) released
	// with the graph.
	saved []*Tensor
	// refill forms the output again into fresh storage after Drop gave
	// it back (selective recomputation); nil for ops that cannot.
	refill func(out *Tensor)
	// leaves are the leaves a checkpointed function reached, which its
	// backward reaches again (full recomputation): Backward counts them
	// as if the function's graph were part of this one.
	leaves []leafUse
	// outUnread says the backward does not read the output (a norm or
	// an activation function, which read their inputs): the output can
	// go before the backward runs.
	outUnread bool
	// exact says the backward reads the output beside statistics of its
	// float32 values (the attention: dout·out beside the log-sum-exp),
	// so it is not stored in 2 bytes under mixed precision (StoreHalf).
	exact bool
	// readsHalf says the backward reads its inputs kept in 2 bytes
	// (StoreHalf) as stored rather than widened first (storedHalf,
	// Tensor.StoredHalf): Linear's and MatMulT's, whose matrix products
	// round their operands to the compute dtype as they read them, so the
	// exactly widened copy would round back to the stored numbers; GELU's
	// and LayerNorm's, whose kernels widen their input a piece at a time
	// into cache as they read it; and the cross-entropies', which form
	// their gradient from the logits in a buffer of its own, so no widened
	// logits sit beside it.
	readsHalf bool
}

// RequiresGrad marks a leaf tensor (a parameter) as needing a gradient.
func (t *Tensor) RequiresGrad() *Tensor {
	t.requiresGrad = true
	return t
}

// NeedsGrad reports whether gradients flow to t (a marked leaf, or the output
// of an op with such an input).
func (t *Tensor) NeedsGrad() bool { return t.requiresGrad }

// IsLeaf reports whether t was not produced by a recorded op.
func (t *Tensor) IsLeaf() bool { return t.node == nil }

// Op names the op that produced t ("" for leaves).
func (t *Tensor) Op() string {
	if t.node == nil {
		return ""
	}
	return t.node.op
}

// record attaches a node to out if any input needs a gradient.
func record(out *Tensor, op string, backward func(b *Backprop, gout *Tensor) []*Tensor, inputs ...*Tensor) {
	needs := false
	ins := make([]*Tensor, len(inputs))
	for i, in := range inputs {
		if in != nil && in.requiresGrad {
			needs = true
			ins[i] = in
		}
	}
	if !needs {
		return
	}
	out.requiresGrad = true
	out.node = &node{op: op, inputs: ins, backward: backward}
}

// saveBuf keeps an op-private buffer with the node of out so it is released
// with the graph.
func saveBuf(out *Tensor, bufs ...*Tensor) {
	if out.node != nil {
		out.node.saved = append(out.node.saved, bufs...)
	}
}

// PassInfo tells hooks which micro-batch of the step is running.
type PassInfo struct {
	Micro int  // index of the micro-batch within the optimizer step
	Last  bool // whether it is the last micro-batch of the step
	// Recompute is set on the forward a checkpointed block runs again in
	// backward (full activation recomputation): module hooks see it, so
	// ZeRO-3 neither prefetches the next unit nor releases this one, whose
	// backward comes next.
	Recompute bool
	// Train marks a training forward (dropout applies; an evaluation's
	// or sampling's forward leaves it false). Step is the optimizer step
	// and Sample0 the index, in the step's global batch, of the first
	// sequence this rank computes: with a row's position they name every
	// element of an activation the same way in every layout, so a dropout
	// mask drawn from them is one process's.
	Train         bool
	Step, Sample0 int
}

// BackwardOptions configures one backward pass.
type BackwardOptions struct {
	Info PassInfo
	// GradReady is called for each leaf the moment its gradient for this
	// pass is final: after its last contribution, so a leaf used twice (the
	// tied wte) fires once. Calls happen in the deterministic backward order.
	GradReady func(p *Tensor, info PassInfo)
	// NeedGrad is called when an op is about to add the first
	// contribution of this pass to leaf p's gradient and p has no Grad:
	// the owner of p's storage may give it one now (ZeRO, a view of the
	// unit's flat gradient buffer, allocated at its first use rather than
	// beside the values its reader still needs). Left without one, p gets
	// a zeroed buffer from Alloc, as without the hook.
	NeedGrad func(p *Tensor, info PassInfo)
	// DeferWeightGrads makes linear layers compute only their input gradient
	// now and queue the weight gradient; run the queue with Deferred.Run.
	// Zero-bubble pipeline schedules use this.
	DeferWeightGrads bool
	// Release returns every intermediate buffer of the graph (activations,
	// op scratch, intermediate gradients) to the allocator: each as soon
	// as the last op backward that reads it is done, or, with
	// DeferWeightGrads, when the deferred weight gradients have run. The
	// root is kept. Tensors of the graph must not be read after their
	// op's backward.
	Release bool
	// Alloc is the allocator for gradients and scratch; nil means Default.
	Alloc *Allocator
}

// Backprop is the state of one backward pass, given to op backward
// functions and hooks.
type Backprop struct {
	Info  PassInfo
	opts  BackwardOptions
	alloc *Allocator

	pending  map[*Tensor]int // leaf -> contributions still to come
	deferred []deferredGrad
	queued   map[*Tensor]int // leaf -> deferred contributions not yet matched
	release  []*Tensor
	// rel is where buffers to release go: release, or the list of a
	// checkpoint's recomputed graph while its backward runs.
	rel *[]*Tensor
	// spent are the gradient contributions of the op that just ran,
	// already added into their leaves' Grad: released as soon as the op
	// is done, so at most one op's temporaries exist at a time.
	spent []*Tensor
}

// accumulated stands, among the gradients an op's backward returns, for
// a leaf input whose contribution the op already added into the leaf's
// Grad (see leafGrad): gradients accumulate in place, and no temporary
// the size of a weight exists beside the weight's gradient.
var accumulated = &Tensor{}

// leafGrad returns the buffer t's gradient accumulates in when t is a
// leaf that takes a gradient, creating it (zeroed) on first use; nil
// otherwise, and the op then returns a gradient of its own. An op that
// adds into it returns accumulated for t.
func (b *Backprop) leafGrad(t *Tensor) *Tensor {
	if t == nil || !t.requiresGrad || t.node != nil {
		return nil
	}
	if t.Grad == nil && b.opts.NeedGrad != nil {
		b.opts.NeedGrad(t, b.Info)
	}
	if t.Grad == nil {
		t.Grad = b.alloc.New(Grads, t.dtype, t.shape...)
		t.Grad.Name = t.Name
	}
	return t.Grad
}

// GradInto is leafGrad for a Function's backward: the buffer to add
// t's gradient contribution into, and what the backward returns for t.
// For a leaf that takes a gradient these are its Grad and the marker
// that says the contribution is already there, so no weight-sized
// temporary exists beside the weight's gradient; otherwise a fresh
// zeroed buffer from the pass's allocator, returned as t's gradient.
// The backward must only add into the buffer (it may hold earlier
// contributions) and must not reduce it over a group.
func (b *Backprop) GradInto(t *Tensor) (buf, ret *Tensor) {
	if buf = b.leafGrad(t); buf != nil {
		return buf, accumulated
	}
	buf = b.alloc.New(Activations, t.dtype, t.shape...)
	return buf, buf
}

// releaseSpent gives the contributions of the op that just ran back to
// the allocator.
func (b *Backprop) releaseSpent() {
	for _, t := range b.spent {
		t.Release()
	}
	b.spent = b.spent[:0]
}

type deferredGrad struct {
	leaf *Tensor
	fn   func() *Tensor
}

// Alloc is the allocator gradients of this pass come from.
func (b *Backprop) Alloc() *Allocator { return b.alloc }

// DeferringWeights reports whether weight gradients should be queued.
func (b *Backprop) DeferringWeights() bool { return b.opts.DeferWeightGrads }

// Defer queues the computation of leaf's gradient contribution; it runs in
// Deferred.Run, in queue order.
func (b *Backprop) Defer(leaf *Tensor, fn func() *Tensor) {
	b.deferred = append(b.deferred, deferredGrad{leaf, fn})
	b.queued[leaf]++
}

// Deferred holds the weight-gradient work queued by a backward pass with
// DeferWeightGrads.
type Deferred struct{ b *Backprop }

// Len is the number of queued weight-gradient computations.
func (d *Deferred) Len() int {
	if d == nil || d.b == nil {
		return 0
	}
	return len(d.b.deferred)
}

// Run computes the queued weight gradients, accumulates them and fires
// their grad-ready callbacks, then releases the graph if asked to.
func (d *Deferred) Run() {
	if d == nil || d.b == nil {
		return
	}
	b := d.b
	for _, dg := range b.deferred {
		g := dg.fn()
		if g == accumulated {
			g = nil
		}
		b.accumulateLeaf(dg.leaf, g)
		b.releaseSpent()
	}
	b.deferred = nil
	b.finish()
	d.b = nil
}

// Backward runs reverse-mode differentiation from root with output gradient
// gout (nil means ones, allowed only for a one-element root). Gradients of
// leaves that require them accumulate into their Grad field. The returned
// Deferred is empty unless opts.DeferWeightGrads is set.
func Backward(root, gout *Tensor, opts BackwardOptions) (d *Deferred, err error) {
	defer func() {
		if r := recover(); r != nil {
			fe, ok := r.(*FunctionError)
			if !ok {
				panic(r)
			}
			d, err = nil, fe
		}
	}()
	if !root.requiresGrad {
		return nil, fmt.Errorf("tensor: backward from %s, which does not require grad", root)
	}
	alloc := opts.Alloc
	if alloc == nil {
		alloc = Default
	}
	if gout == nil {
		if root.Numel() != 1 {
			return nil, fmt.Errorf("tensor: backward from %s needs an output gradient (it is not a scalar)", root)
		}
		gout = alloc.New(Activations, root.dtype, root.shape...)
		gout.Set(0, 1)
	} else if gout.Numel() != root.Numel() || gout.dtype != root.dtype {
		return nil, fmt.Errorf("tensor: output gradient %s does not match %s", gout, root)
	} else {
		// The caller keeps its buffer: gradients are accumulated in place.
		c := alloc.NewUninit(Activations, gout.dtype, root.shape...)
		c.CopyFrom(gout)
		gout = c
	}
	b := &Backprop{Info: opts.Info, opts: opts, alloc: alloc, pending: map[*Tensor]int{}, queued: map[*Tensor]int{}}

	b.rel = &b.release

	order := topo(root)
	// Count how many edges reach each leaf so a leaf used twice is final
	// only after its last contribution.
	for _, t := range order {
		for _, in := range t.node.inputs {
			if in != nil && in.node == nil {
				b.pending[in]++
			}
		}
		for _, l := range t.node.leaves {
			b.pending[l.t] += l.n
		}
	}
	b.pass(order, root, gout, nil, true)
	if opts.DeferWeightGrads && len(b.deferred) > 0 {
		return &Deferred{b: b}, nil
	}
	b.finish()
	return &Deferred{}, nil
}

// pass runs the op backwards of order (topological, root last) from the
// root's gradient gout. sink, when set, is a leaf whose gradient is
// returned instead of accumulated (a checkpoint's input); outer says
// the pass owns the whole graph: its root and gout are released with the
// rest, where a checkpoint's pass leaves gout to the pass around it.
func (b *Backprop) pass(order []*Tensor, root, gout, sink *Tensor, outer bool) (gsink *Tensor) {
	release := b.opts.Release
	// Without deferred weight gradients nothing reads a buffer of the
	// graph after the op backwards that use it: an activation once its
	// own op's backward (its consumers' ran before it) is done, a
	// gradient once its op's backward has consumed it. Both go back to
	// the allocator then, so the backward holds the forward's saved
	// tensors minus those already passed, plus one op's gradients; with
	// deferred weight gradients the W pass reads them later and they go
	// when it is done.
	early := release && !b.opts.DeferWeightGrads
	free := func(ts ...*Tensor) {
		if early {
			for _, t := range ts {
				t.Release()
			}
		} else {
			*b.rel = append(*b.rel, ts...)
		}
	}
	grads := map[*Tensor]*Tensor{root: gout}
	for i := len(order) - 1; i >= 0; i-- {
		t := order[i]
		g := grads[t]
		delete(grads, t)
		if g == nil {
			continue // no gradient reached this node
		}
		if early && t.node.outUnread && (t != root || !outer) {
			// Every reader of t, its consumers, has run; its own backward
			// reads only its inputs.
			t.Release()
			t.dropView()
		} else {
			refill(t)
		}
		for _, in := range t.node.inputs {
			if !t.node.readsHalf || in == nil || storedHalf(in) == nil {
				refill(in)
			}
		}
		ins := t.node.backward(b, g)
		if t.refilled && early {
			// Selective recomputation: every reader of t (its consumers,
			// then this op) has run; give the storage back again.
			t.Release()
			t.dropView()
		}
		if len(ins) != len(t.node.inputs) {
			panic(fmt.Sprintf("tensor: backward of %s returned %d gradients for %d inputs", t.node.op, len(ins), len(t.node.inputs)))
		}
		keepG := false
		for j, in := range t.node.inputs {
			gi := ins[j]
			if gi == accumulated {
				b.accumulateLeaf(in, nil)
				continue
			}
			if gi == nil {
				if in != nil && in.node == nil && in != sink {
					if b.queued[in] > 0 {
						// This op queued the contribution instead; the
						// leaf's count drops when the queue runs.
						b.queued[in]--
					} else {
						b.accumulateLeaf(in, nil)
					}
				}
				continue
			}
			if in == nil {
				continue
			}
			// Pass-through backward functions (add, view, hooks) hand on
			// g itself or a view of it: give each input its own buffer
			// since gradients are accumulated in place.
			for k := 0; k < j; k++ {
				if ins[k] != nil && t.node.inputs[k] != nil && sameStorage(gi, ins[k]) {
					c := b.alloc.NewUninit(Activations, gi.dtype, gi.shape...)
					c.CopyFrom(gi)
					gi = c
					break
				}
			}
			if in.node == nil && in != sink {
				b.accumulateLeaf(in, gi)
				continue
			}
			prev := grads[in]
			if in == sink {
				prev = gsink
			}
			if prev != nil {
				addInto(prev, gi)
				if release && !sameStorage(gi, g) {
					free(gi)
				}
				continue
			}
			if sameStorage(gi, g) {
				// g lives on as in's gradient: a view of it takes over
				// its storage, so releasing the view gives it back.
				keepG = true
				if gi != g && gi.alloc == nil && g.alloc != nil {
					gi.alloc, g.alloc = g.alloc, nil
				}
			}
			if in == sink {
				gsink = gi
			} else {
				grads[in] = gi
			}
		}
		b.releaseSpent()
		if release && !keepG && (outer || t != root) {
			free(g)
		}
		if release {
			if t != root || !outer {
				free(t)
			}
			free(t.node.saved...)
		}
	}
	return gsink
}

// nested runs the backward of a checkpoint's recomputed graph (order, from
// root) within this pass, from the checkpoint output's gradient g, and
// returns the gradient of its input sink. The recomputed buffers are
// released when it returns, unless weight gradients are deferred (a
// zero-bubble pipeline's W pass reads them).
func (b *Backprop) nested(order []*Tensor, root, g, sink *Tensor) *Tensor {
	var local []*Tensor
	around := b.rel
	b.rel = &local
	gs := b.pass(order, root, g, sink, false)
	b.rel = around
	if b.opts.DeferWeightGrads {
		*around = append(*around, local...)
	} else {
		for _, t := range local {
			t.Release()
		}
	}
	return gs
}

// accumulateLeaf adds one contribution (nil = none, or already added in
// place) to leaf.Grad and fires GradReady after the last one. The
// contribution is spent: it is released when its op is done.
func (b *Backprop) accumulateLeaf(leaf, g *Tensor) {
	if g != nil {
		addInto(b.leafGrad(leaf), g)
		b.spent = append(b.spent, g)
	}
	b.pending[leaf]--
	if b.pending[leaf] == 0 && b.opts.GradReady != nil {
		b.opts.GradReady(leaf, b.Info)
	}
}

func (b *Backprop) finish() {
	for _, t := range b.release {
		t.Release()
	}
	b.release = nil
}

// topo returns the non-leaf tensors reachable from root in an order where
// every tensor comes after its inputs. Inputs are visited in argument order
// so the result depends only on how the graph was built.
func topo(root *Tensor) []*Tensor {
	var order []*Tensor
	seen := map[*Tensor]bool{}
	type frame struct {
		t    *Tensor
		next int
	}
	stack := []frame{{t: root}}
	seen[root] = true
	for len(stack) > 0 {
		f := &stack[len(stack)-1]
		if f.next < len(f.t.node.inputs) {
			in := f.t.node.inputs[f.next]
			f.next++
			if in != nil && in.node != nil && !seen[in] {
				seen[in] = true
				stack = append(stack, frame{t: in})
			}
			continue
		}
		order = append(order, f.t)
		stack = stack[:len(stack)-1]
	}
	return order
}

// FreeGraph releases the intermediate buffers of a graph that will not be
// differentiated (e.g. after an evaluation forward). The root is kept.
func FreeGraph(root *Tensor) {
	if root.node == nil {
		return
	}
	for _, t := range topo(root) {
		if t != root {
			t.Release()
		}
		for _, s := range t.node.saved {
			s.Release()
		}
	}
	root.node = nil
}

// Detach returns a tensor sharing t's storage with no autograd history.
func (t *Tensor) Detach() *Tensor {
	return t.Reshape(t.shape...)
}

// sameStorage reports whether a and b share their first element's memory.
func sameStorage(a, b *Tensor) bool {
	if a == b {
		return true
	}
	if a.dtype != b.dtype {
		return false
	}
	switch a.dtype {
	case Float32:
		return len(a.f32) > 0 && len(b.f32) > 0 && &a.f32[0] == &b.f32[0]
	case Float64:
		return len(a.f64) > 0 && len(b.f64) > 0 && &a.f64[0] == &b.f64[0]
	}
	return false
}
