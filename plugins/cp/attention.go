package cp

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trace"
)

// Attention is the attention core of a context-parallel rank (it replaces
// nn.CausalAttention): causal attention of this rank's queries over the
// keys of the whole sequence, which the ranks of G hold in parts. Pos[j]
// are the global positions of rank j's rows; the input's rows are this
// rank's, Pos[G.Rank()].
//
// Ring passes key/value blocks around the group (ring.go); otherwise the
// keys and values are all-gathered first (allgather.go). Both give the
// whole sequence's attention rows of this rank, exactly (up to the order
// of floating-point sums).
//
// A Llama's core (NKVHead > 0) first turns this rank's q and k by their
// global positions (RoPE, base RopeTheta), so every key block travels
// already rotated, and its query heads read their groups' key/value
// heads.
type Attention struct {
	NHead     int
	NKVHead   int     // Llama only
	RopeTheta float64 // Llama only
	G         comm.Group
	Pos       [][]int
	Ring      bool
	Alloc     *tensor.Allocator // nil: tensor.Default
	Trace     *trace.Recorder   // nil: no spans
	Stats     *Stats            // nil: not counted

	// computed, when set, is called after each key block's compute (what
	// is "block" or "block backward"): the overlap tests open their gate
	// on the transfers from it.
	computed func(what string, step int)
}

// Stats counts the attention work a rank did in forward passes: the
// (query, key) pairs of the key blocks it computed (see Pairs), the time
// spent computing them, and the blocks skipped as entirely in the future.
type Stats struct {
	Pairs, Nanos, Blocks, Skipped atomic.Int64
}

// Forward implements nn.Layer on the fused q|k|v of this rank's rows.
func (a *Attention) Forward(qkv *tensor.Tensor, _ nn.Pass) (*tensor.Tensor, error) {
	if a.G == nil || len(a.Pos) != a.G.Size() {
		return nil, fmt.Errorf("cp: attention needs the context-parallel group and the positions of each of its ranks")
	}
	if n := len(a.Pos[a.G.Rank()]); qkv.Dim(1) != n {
		return nil, fmt.Errorf("cp: rank %d's attention got %d rows of each sequence; it holds %d (positions %v)", a.G.Rank(), qkv.Dim(1), n, a.Pos[a.G.Rank()])
	}
	if a.NKVHead > 0 {
		qkv = tensor.RoPE(qkv, a.NHead, a.NKVHead, a.Pos[a.G.Rank()], a.RopeTheta)
	}
	if a.Ring {
		return tensor.Apply("cp.ring_attention", &ringFn{a: a}, qkv)
	}
	return tensor.Apply("cp.allgather_attention", &gatherFn{a: a}, qkv)
}

func (a *Attention) alloc() *tensor.Allocator {
	if a.Alloc == nil {
		return tensor.Default
	}
	return a.Alloc
}

// backAlloc is the allocator of a backward pass.
func backAlloc(ctx *tensor.FuncCtx) *tensor.Allocator {
	if ctx.Backprop != nil {
		return ctx.Backprop.Alloc()
	}
	return tensor.Default
}

// neighbours are the ranks a ring sends to and receives from.
func (a *Attention) neighbours() (next, prev int) {
	n, r := a.G.Size(), a.G.Rank()
	return (r + 1) % n, (r - 1 + n) % n
}

// errorf names the rank, the group and the operation.
func (a *Attention) errorf(what string, err error) error {
	return fmt.Errorf("cp: rank %d of group %s: %s: %w", a.G.Rank(), a.G.Name(), what, err)
}

// compute runs one key block's work under a compute span and counts it.
func (a *Attention) compute(what string, step, src int, pairs int64, f func()) {
	span := a.Trace.Begin("cp "+what, "cp", trace.Compute).With("step", step).With("block", src)
	t0 := time.Now()
	f()
	span.End()
	if a.computed != nil {
		a.computed(what, step)
	}
	if a.Stats != nil && what == "block" {
		a.Stats.Pairs.Add(pairs)
		a.Stats.Nanos.Add(time.Since(t0).Nanoseconds())
		a.Stats.Blocks.Add(1)
	}
}

// skipped counts a key block entirely in the queries' future.
func (a *Attention) skipped() {
	if a.Stats != nil {
		a.Stats.Skipped.Add(1)
	}
}

// pending is a transfer in flight: a goroutine waits for its handles and
// ends its trace span the moment they complete, so the trace shows how
// long the transfer really took beside the compute it overlapped.
type pending struct{ done chan error }

// post watches handles already issued (in the caller's goroutine, so
// every rank issues its sends and receives in one order) under a span.
func (a *Attention) post(what string, step int, bytes int64, hs ...comm.Handle) *pending {
	p := &pending{done: make(chan error, 1)}
	span := a.Trace.Begin("cp "+what, "comm", trace.Comm).With("step", step).With("bytes", bytes).With("group", a.G.Name())
	go func() {
		var first error
		for _, h := range hs {
			if err := h.Wait(); err != nil && first == nil {
				first = err
			}
		}
		span.End()
		p.done <- first
	}()
	return p
}

// wait returns the transfer's error (nil for a nil pending).
func (p *pending) wait() error {
	if p == nil {
		return nil
	}
	err := <-p.done
	p.done <- err // a second wait sees the same
	return err
}

// waitAll waits for every transfer, so that no buffer is released while a
// transfer still uses it, and returns the first error.
func waitAll(ps ...*pending) error {
	var first error
	for _, p := range ps {
		if err := p.wait(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
