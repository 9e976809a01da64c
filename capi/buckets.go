package main

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
	"github.com/tinyacc/tinyacc/core/trace"
)

// Registered buffers and the bucketed gradient reducer.
//
// A framework that computes gradients itself (PyTorch) lays every gradient
// of a bucket into one float32 buffer it owns, registers that buffer once
// (tinyacc_buffer_register) and keeps it alive until it frees the handle.
// Unlike the plain collectives, which copy the caller's memory for the
// duration of a call, the reducer works on the registered memory in place
// from its own goroutine, after the registering call has returned: that is
// what lets a bucket's all-reduce run while the caller is still computing
// the gradients of the next bucket. Go memory never crosses to the caller;
// the caller's memory is only borrowed.
//
// Ranks must issue collectives in the same order. Buckets may be announced
// ready in any order (autograd's order can differ between ranks), so the
// reducer launches them strictly by index: bucket i starts once buckets
// 0..i are all ready. With buckets laid out in reverse parameter order,
// index order is the order backward finishes them, and the delay is nil.

// bufferObj is caller memory registered through the C ABI. Operations hold
// the read lock while they use it; release takes the write lock, so freeing
// the handle waits for an all-reduce in flight instead of letting it write
// into memory the caller has reused.
type bufferObj struct {
	mu       sync.RWMutex
	data     []float32
	released bool
}

func (b *bufferObj) release() {
	b.mu.Lock()
	b.released = true
	b.data = nil
	b.mu.Unlock()
}

// apiBufferRegister registers data (caller memory, valid until the handle
// is freed) and returns its handle.
func apiBufferRegister(data []float32) (int64, error) {
	if len(data) == 0 {
		return 0, fail(errInvalidArg, "buffer_register: a buffer needs at least one element")
	}
	return register(&bufferObj{data: data}), nil
}

// groupRunner runs fn on the data-parallel group, serialised with the other
// collectives of the process (withWorld in the library).
type groupRunner func(fn func(g comm.Group) error) error

type bucketDone struct {
	bucket int
	err    error
}

// reducerObj averages a fixed list of buckets over the ranks, one
// all-reduce per bucket per round. A round is: bucket_ready for some
// buckets (each at most once), then buckets_wait.
type reducerObj struct {
	bufs    []*bufferObj
	run     groupRunner
	timeout time.Duration
	rank    int
	rec     *trace.Recorder // nil: no trace
	// reduceDType is the dtype buckets are reduced in (ddp.reduce_dtype,
	// tinyacc_reducer_reduce_dtype): Float32, or BFloat16, where a bucket
	// is rounded into wire[i], all-reduced (summed in float32, rounded
	// once) and widened back. Set before the first round.
	reduceDType tensor.DType
	wire        [][]uint16

	mu       sync.Mutex
	ready    []bool
	next     int // buckets 0..next-1 are launched this round
	launch   chan int
	done     chan bucketDone
	finished []bool
	broken   error // a round that timed out leaves the reducer unusable
}

// newReducer starts the reducer's worker goroutine over bufs.
func newReducer(bufs []*bufferObj, run groupRunner, rank int, timeout time.Duration, traced bool) *reducerObj {
	r := &reducerObj{bufs: bufs, run: run, rank: rank, timeout: timeout,
		ready: make([]bool, len(bufs)), finished: make([]bool, len(bufs)),
		launch: make(chan int, len(bufs)), done: make(chan bucketDone, len(bufs))}
	if traced {
		r.rec = trace.New(rank)
	}
	go r.work()
	return r
}

// work all-reduces launched buckets one after another, in launch (= index)
// order, in the caller's memory.
func (r *reducerObj) work() {
	for i := range r.launch {
		r.done <- bucketDone{i, r.reduce(i)}
	}
}

func (r *reducerObj) reduce(i int) error {
	b := r.bufs[i]
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.released {
		return fmt.Errorf("its buffer was freed while the reducer still uses it")
	}
	if r.reduceDType == tensor.BFloat16 {
		w := r.wire[i]
		cpu.BF16FromF32s(w, b.data)
		span := r.rec.Begin(fmt.Sprintf("all-reduce bucket %d", i), "comm", trace.Comm).With("bucket", i).With("bytes", 2*len(w))
		err := r.run(func(g comm.Group) error {
			return g.AllReduce(tensor.FromBF16(w, len(w)), comm.Avg)
		})
		span.End()
		if err == nil {
			cpu.BF16ToF32s(b.data, w)
		}
		return err
	}
	span := r.rec.Begin(fmt.Sprintf("all-reduce bucket %d", i), "comm", trace.Comm).With("bucket", i).With("bytes", 4*len(b.data))
	err := r.run(func(g comm.Group) error {
		return g.AllReduce(tensor.FromF32(b.data, len(b.data)), comm.Avg)
	})
	span.End()
	return err
}

// setReduceDType sets the dtype of the reductions: "fp32" or "bf16" (the
// values of ddp.reduce_dtype), before any bucket of the first round.
func (r *reducerObj) setReduceDType(name string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.next > 0 {
		return fail(errState, "reducer_reduce_dtype: a round has started; set the dtype before the first bucket_ready")
	}
	switch name {
	case "fp32":
		r.reduceDType, r.wire = tensor.Float32, nil
	case "bf16":
		r.reduceDType, r.wire = tensor.BFloat16, make([][]uint16, len(r.bufs))
		for i, b := range r.bufs {
			r.wire[i] = make([]uint16, len(b.data))
		}
	default:
		return fail(errInvalidArg, "reducer_reduce_dtype: %q is not a reduce dtype: use fp32 or bf16 (ddp.reduce_dtype)", name)
	}
	return nil
}

// release stops the worker once the handle is freed.
func (r *reducerObj) release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.launch != nil {
		close(r.launch)
		r.launch = nil
	}
	if r.broken == nil {
		r.broken = fmt.Errorf("the reducer was freed")
	}
}

// bucketReady announces that bucket i's gradients are final on this rank
// and launches every bucket whose turn has come.
func (r *reducerObj) bucketReady(i int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.broken != nil {
		return fail(errState, "bucket_ready: rank %d: %v", r.rank, r.broken)
	}
	if i < 0 || i >= len(r.bufs) {
		return fail(errInvalidArg, "bucket_ready: bucket %d is outside 0..%d", i, len(r.bufs)-1)
	}
	if r.ready[i] {
		return fail(errState, "bucket_ready: bucket %d was already announced in this round; call buckets_wait first", i)
	}
	r.ready[i] = true
	r.rec.Begin(fmt.Sprintf("bucket %d ready", i), "compute", trace.Compute).With("bucket", i).End()
	r.launchReady()
	return nil
}

// launchReady sends buckets next, next+1, ... while they are ready; the
// caller holds r.mu.
func (r *reducerObj) launchReady() {
	for r.next < len(r.bufs) && r.ready[r.next] {
		r.launch <- r.next
		r.next++
	}
}

// waitAll launches the buckets not announced this round (their memory is
// reduced as it is: zeros for gradients nothing produced), waits for every
// all-reduce of the round, and starts a new round. It gives up after the
// timeout, naming this rank and the buckets still unfinished.
func (r *reducerObj) waitAll() error {
	r.mu.Lock()
	if r.broken != nil {
		r.mu.Unlock()
		return fail(errState, "buckets_wait: rank %d: %v", r.rank, r.broken)
	}
	for i := range r.ready {
		r.ready[i] = true
	}
	r.launchReady()
	r.mu.Unlock()

	span := r.rec.Begin("buckets wait", "compute", trace.Compute)
	defer span.End()
	timer := time.NewTimer(r.timeout)
	defer timer.Stop()
	var errs []string
	for got := 0; got < len(r.bufs); got++ {
		select {
		case d := <-r.done:
			r.finished[d.bucket] = true
			if d.err != nil {
				errs = append(errs, fmt.Sprintf("bucket %d (%d elements): %v", d.bucket, len(r.bufs[d.bucket].data), d.err))
			}
		case <-timer.C:
			var missing []string
			for i, f := range r.finished {
				if !f {
					missing = append(missing, fmt.Sprint(i))
				}
			}
			err := fmt.Errorf("rank %d: the all-reduce of bucket(s) %s did not finish within comm.timeout %v (is another rank stuck before its backward, or dead?)",
				r.rank, strings.Join(missing, ", "), r.timeout)
			r.mu.Lock()
			r.broken = err
			r.mu.Unlock()
			return wrap(errComm, err)
		}
	}
	r.mu.Lock()
	for i := range r.ready {
		r.ready[i], r.finished[i] = false, false
	}
	r.next = 0
	r.mu.Unlock()
	if len(errs) > 0 {
		sort.Strings(errs)
		return fail(errComm, "rank %d: gradient all-reduce failed: %s", r.rank, strings.Join(errs, "; "))
	}
	return nil
}
