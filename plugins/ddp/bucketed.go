package ddp

import (
	"errors"
	"fmt"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trace"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// bucket is one flat gradient buffer and the parameters whose gradients
// are views of it.
type bucket struct {
	index int
	flat  *tensor.Tensor // float32, accounted as gradients
	// wire is flat rounded to bfloat16 for the all-reduce under
	// ddp.reduce_dtype=bf16 (accounted as communication); nil otherwise.
	wire   *tensor.Tensor
	params []*tensor.Tensor
	// pending counts the gradients of this bucket not yet final in the
	// current step's last micro-batch; the all-reduce starts at zero.
	pending int
	flight  *inflight // nil until the all-reduce is issued
}

// slot says where a parameter's gradient lives.
type slot struct {
	b     *bucket
	view  *tensor.Tensor // the p.Grad installed at Prepare
	ready bool           // final in this step's last micro-batch
}

// inflight is a bucket all-reduce that was issued. A watcher goroutine
// waits for it so its trace span ends when the collective completes, not
// when PreStep gets around to asking.
type inflight struct {
	done chan struct{}
	err  error
}

// BucketInfo describes one bucket, for logs and tests.
type BucketInfo struct {
	Index  int
	Params []string // in layout order (reverse order of use)
	Bytes  int64
}

// Buckets describes the bucket layout made by Prepare (nil in naive mode
// or before Prepare).
func (d *DDP) Buckets() []BucketInfo {
	var out []BucketInfo
	for _, b := range d.buckets {
		info := BucketInfo{Index: b.index, Bytes: b.flat.Bytes()}
		for _, p := range b.params {
			info.Params = append(info.Params, p.Name)
		}
		out = append(out, info)
	}
	return out
}

// planBuckets splits items of the given sizes (bytes), taken in order, into
// consecutive groups: the first group holds at most firstCap bytes, the
// others at most capBytes, except that an item larger than the cap gets a
// group of its own (gradients are never split across buckets). It returns
// the item indices of each group.
func planBuckets(sizes []int64, firstCap, capBytes int64) [][]int {
	var groups [][]int
	var cur []int
	var used int64
	limit := firstCap
	for i, s := range sizes {
		if len(cur) > 0 && used+s > limit {
			groups = append(groups, cur)
			cur, used, limit = nil, 0, capBytes
		}
		cur = append(cur, i)
		used += s
	}
	if len(cur) > 0 {
		groups = append(groups, cur)
	}
	return groups
}

// layout allocates the buckets and makes every p.Grad a view of its slice
// of one, so backward accumulates straight into what is sent.
func (d *DDP) layout(t *trainer.Trainer) error {
	params := replicated(t)
	// Reverse order of use: backward makes the last layers' gradients
	// final first, and wte (first used by the embedding lookup) last.
	order := make([]*tensor.Tensor, len(params))
	sizes := make([]int64, len(params))
	for i := range params {
		q := params[len(params)-1-i]
		if q.DType() != t.DType() {
			return fmt.Errorf("ddp: parameter %s is %s but the model trains in %s; a bucket is one flat buffer (use ddp.mode: naive)", q.Name, q.DType(), t.DType())
		}
		order[i], sizes[i] = q, q.Bytes()
	}
	d.buckets, d.slots = nil, map[*tensor.Tensor]*slot{}
	for bi, idx := range planBuckets(sizes, d.firstBytes, d.bucketBytes) {
		n := 0
		for _, i := range idx {
			n += order[i].Numel()
		}
		b := &bucket{index: bi, flat: t.Alloc.New(tensor.Grads, t.DType(), n)}
		b.flat.Name = fmt.Sprintf("ddp.bucket.%d", bi)
		if d.halfWire(t) {
			b.wire = t.Alloc.New(tensor.Comm, tensor.BFloat16, n)
		}
		off := 0
		for _, i := range idx {
			p := order[i]
			k := p.Numel()
			view := b.flat.Span(off, off+k, p.Shape()...)
			view.Name = p.Name
			if p.Grad != nil {
				// Keep a gradient accumulated before Prepare.
				view.CopyFrom(p.Grad)
				p.Grad.Release()
			}
			p.Grad = view
			b.params = append(b.params, p)
			d.slots[p] = &slot{b: b, view: view}
			off += k
		}
		b.pending = len(b.params)
		d.buckets = append(d.buckets, b)
	}
	return nil
}

// gradReady counts p's gradient as final for this step and issues its
// bucket's all-reduce when it was the bucket's last one.
func (d *DDP) gradReady(t *trainer.Trainer, p *tensor.Tensor) error {
	s, ok := d.slots[p]
	if !ok && heldBySome(p) {
		return nil // its replicas reduce it (see replicated)
	}
	if !ok {
		return fmt.Errorf("ddp: parameter %s has no gradient bucket; parameters added after ddp's Prepare are not synchronised (list ddp after plugins that rewrite the model)", p.Name)
	}
	if p.Grad != s.view {
		return fmt.Errorf("ddp: the gradient of %s is no longer a view of bucket %d; something replaced p.Grad after ddp's Prepare", p.Name, s.b.index)
	}
	if s.ready {
		return fmt.Errorf("ddp: gradient of %s reported final twice in one step (bucket %d)", p.Name, s.b.index)
	}
	s.ready = true
	s.b.pending--
	if s.b.pending == 0 {
		d.launch(t, s.b)
	}
	return nil
}

// launch issues b's asynchronous all-reduce; backward may go on meanwhile
// because no later gradient of this step writes into b.
func (d *DDP) launch(t *trainer.Trainer, b *bucket) {
	sent := b.flat
	if b.wire != nil {
		roundInto(b.wire, b.flat)
		sent = b.wire
	}
	span := t.Trace.Begin(fmt.Sprintf("all_reduce bucket %d", b.index), "comm", trace.Comm).
		With("bytes", sent.Bytes()).With("params", len(b.params))
	h := d.g.AllReduceAsync(sent, comm.Avg)
	f := &inflight{done: make(chan struct{})}
	go func() {
		f.err = h.Wait()
		if f.err == nil && b.wire != nil {
			widenInto(b.flat, b.wire)
		}
		span.End()
		close(f.done)
	}()
	b.flight = f
}

// finishBuckets issues the buckets backward left incomplete (a parameter
// that got no gradient this step; every rank sees the same), waits for all
// of them and resets the counts for the next step.
func (d *DDP) finishBuckets(t *trainer.Trainer) error {
	for _, b := range d.buckets {
		if b.flight == nil {
			d.launch(t, b)
		}
	}
	var errs []error
	for _, b := range d.buckets {
		<-b.flight.done
		if b.flight.err != nil {
			errs = append(errs, fmt.Errorf("ddp: all-reduce of gradient bucket %d (%d bytes, first %s): %w",
				b.index, b.flat.Bytes(), b.params[0].Name, b.flight.err))
		}
		b.flight = nil
		b.pending = len(b.params)
		for _, p := range b.params {
			d.slots[p].ready = false
		}
	}
	return errors.Join(errs...)
}
