//go:build cgo && linux

package comm

/*
#include <stdint.h>
#include <stdlib.h>
int tac_split(uint64_t, int, int, uint64_t*);
int tac_free(uint64_t*);
int tac_iallreduce(void*, int, int, int, uint64_t, uint64_t*);
int tac_ireduce_scatter(void*, void*, int, int, int, uint64_t, uint64_t*);
int tac_iallgatherv(void*, int, void*, int*, int*, int, uint64_t, uint64_t*);
int tac_ibcast(void*, int, int, int, uint64_t, uint64_t*);
int tac_ireduce(void*, int, int, int, int, int, uint64_t, uint64_t*);
int tac_ibarrier(uint64_t, uint64_t*);
int tac_isend(void*, int, int, int, uint64_t, uint64_t*);
int tac_irecv(void*, int, int, int, uint64_t, uint64_t*);
int tac_undefined(void);
*/
import "C"

import (
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// mpiGroup is a Group on one MPI communicator. Arguments are checked on the
// caller's goroutine as in the tcp backend; the work runs on the engine.
type mpiGroup struct {
	e       *mpiEngine
	comm    C.uint64_t
	name    string
	me      int
	ranks   []int // world rank of each group rank
	opts    Options
	isWorld bool

	mu     sync.Mutex
	seq    uint64
	broken error
	closed bool
	leaked []any // buffers of operations MPI never finished
}

func (g *mpiGroup) Rank() int                   { return g.me }
func (g *mpiGroup) Size() int                   { return len(g.ranks) }
func (g *mpiGroup) Name() string                { return g.name }
func (g *mpiGroup) WorldRank(groupRank int) int { return g.ranks[groupRank] }

func (g *mpiGroup) leak(keep []any) {
	g.mu.Lock()
	g.leaked = append(g.leaked, keep...)
	g.mu.Unlock()
}

// start queues an operation: on the engine, start returns the request (or
// an MPI error) and finish runs once it completed.
func (g *mpiGroup) start(name string, start func(req *C.uint64_t) C.int, finish func(), keep ...any) Handle {
	return g.startOp(name, false, start, finish, keep...)
}

// startOp is start; an eager operation completes once MPI accepted it, and
// the request goes on in the background (a later failure breaks the group).
func (g *mpiGroup) startOp(name string, eager bool, start func(req *C.uint64_t) C.int, finish func(), keep ...any) Handle {
	o := &mpiOpState{g: g, name: name, done: make(chan struct{})}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return failed{fmt.Errorf("comm: %s on group %q: %w", name, g.name, errClosed)}
	}
	g.seq++
	o.seq = g.seq
	g.mu.Unlock()
	deadline := time.Now().Add(g.opts.Timeout)
	g.e.calls <- func() {
		g.mu.Lock()
		broken := g.broken
		g.mu.Unlock()
		if broken != nil {
			o.err = fmt.Errorf("comm: %s on group %q seq %d not run: the group failed earlier: %w", name, g.name, o.seq, broken)
			close(o.done)
			return
		}
		p := &mpiPending{deadline: deadline, o: o, finish: finish, keep: keep}
		if rc := start(&p.req); rc != 0 {
			o.fail(fmt.Errorf("comm: %s on group %q seq %d failed to start: %w", name, g.name, o.seq, mpiError(rc)))
			return
		}
		if eager {
			p.o = &mpiOpState{g: g, name: name, seq: o.seq, done: make(chan struct{})}
			close(o.done)
		}
		g.e.pending = append(g.e.pending, p)
	}
	return o
}

func (g *mpiGroup) reject(name string, err error) Handle {
	return failed{fmt.Errorf("comm: %s on group %q: %w", name, g.name, err)}
}

// avgFinish divides buf by the group size after a sum, for Avg.
func (g *mpiGroup) avgFinish(op ReduceOp, dt tensor.DType, buf []byte) func() {
	if op != Avg {
		return nil
	}
	return func() { scaleBytes(dt, buf, len(g.ranks)) }
}

// mpiWide is how this backend reduces half dtypes by the rule of half.go:
// src widened to a float32 buffer that MPI reduces in place, and a finish
// that divides by the group size for Avg and rounds into dst once.
func (g *mpiGroup) mpiWide(op ReduceOp, dt tensor.DType, src, dst []byte, wideOut int) (in, out []float32, finish func()) {
	in = make([]float32, len(src)/2)
	tensor.WidenHalf(dt, in, u16s(src))
	out = in
	if wideOut != len(in) {
		out = make([]float32, wideOut)
	}
	return in, out, func() {
		if op == Avg {
			scaleBytes(tensor.Float32, f32Bytes(out), len(g.ranks))
		}
		tensor.NarrowHalf(dt, u16s(dst), out)
	}
}

func f32Bytes(s []float32) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*4)
}

func (g *mpiGroup) AllReduce(t *tensor.Tensor, op ReduceOp) error {
	return g.AllReduceAsync(t, op).Wait()
}

func (g *mpiGroup) AllReduceAsync(t *tensor.Tensor, op ReduceOp) Handle {
	const name = "all_reduce"
	if err := checkReduceArgs(t, op); err != nil {
		return g.reject(name, err)
	}
	dt, buf := t.DType(), bytesOf(t)
	if isHalf(dt) {
		w, _, finish := g.mpiWide(op, dt, buf, buf, t.Numel())
		return g.start(name, func(req *C.uint64_t) C.int {
			return C.tac_iallreduce(bufPtr(f32Bytes(w)), C.int(len(w)), mpiDType(tensor.Float32), mpiOp(op), g.comm, req)
		}, finish, t, w)
	}
	return g.start(name, func(req *C.uint64_t) C.int {
		return C.tac_iallreduce(bufPtr(buf), C.int(t.Numel()), mpiDType(dt), mpiOp(op), g.comm, req)
	}, g.avgFinish(op, dt, buf), t)
}

func (g *mpiGroup) ReduceScatter(in, out *tensor.Tensor, op ReduceOp) error {
	return g.ReduceScatterAsync(in, out, op).Wait()
}

func (g *mpiGroup) ReduceScatterAsync(in, out *tensor.Tensor, op ReduceOp) Handle {
	const name = "reduce_scatter"
	if err := checkReduceScatterArgs(in, out, op, len(g.ranks)); err != nil {
		return g.reject(name, err)
	}
	dt, ib, ob := in.DType(), bytesOf(in), bytesOf(out)
	if isHalf(dt) {
		wi, wo, finish := g.mpiWide(op, dt, ib, ob, out.Numel())
		return g.start(name, func(req *C.uint64_t) C.int {
			return C.tac_ireduce_scatter(bufPtr(f32Bytes(wi)), bufPtr(f32Bytes(wo)), C.int(len(wo)), mpiDType(tensor.Float32), mpiOp(op), g.comm, req)
		}, finish, in, out, wi, wo)
	}
	return g.start(name, func(req *C.uint64_t) C.int {
		return C.tac_ireduce_scatter(bufPtr(ib), bufPtr(ob), C.int(out.Numel()), mpiDType(dt), mpiOp(op), g.comm, req)
	}, g.avgFinish(op, dt, ob), in, out)
}

func (g *mpiGroup) AllGather(in, out *tensor.Tensor) error { return g.AllGatherAsync(in, out).Wait() }

func (g *mpiGroup) AllGatherAsync(in, out *tensor.Tensor) Handle {
	const name = "all_gather"
	n := len(g.ranks)
	if err := checkAllGatherArgs(in, out, n); err != nil {
		return g.reject(name, err)
	}
	counts := make([]int, n)
	for r := range counts {
		counts[r] = in.Numel()
	}
	return g.allGatherV(name, in, out, counts)
}

func (g *mpiGroup) AllGatherV(in, out *tensor.Tensor, counts []int) error {
	return g.AllGatherVAsync(in, out, counts).Wait()
}

func (g *mpiGroup) AllGatherVAsync(in, out *tensor.Tensor, counts []int) Handle {
	const name = "all_gather_v"
	if _, err := checkAllGatherVArgs(in, out, counts, g.me, len(g.ranks)); err != nil {
		return g.reject(name, err)
	}
	return g.allGatherV(name, in, out, counts)
}

// allGatherV passes counts and displacements in C memory, which MPI reads
// until the operation completes.
func (g *mpiGroup) allGatherV(name string, in, out *tensor.Tensor, counts []int) Handle {
	n := len(g.ranks)
	arr := (*[1 << 28]C.int)(C.malloc(C.size_t(2 * n * int(unsafe.Sizeof(C.int(0))))))[: 2*n : 2*n]
	off := 0
	for r, k := range counts {
		arr[r], arr[n+r] = C.int(k), C.int(off)
		off += k
	}
	dt, ib, ob := in.DType(), bytesOf(in), bytesOf(out)
	free := func() { C.free(unsafe.Pointer(&arr[0])) }
	h := g.start(name, func(req *C.uint64_t) C.int {
		return C.tac_iallgatherv(bufPtr(ib), C.int(in.Numel()), bufPtr(ob), &arr[0], &arr[n], mpiDType(dt), g.comm, req)
	}, free, in, out)
	if f, ok := h.(failed); ok {
		free()
		return f
	}
	return h
}

func (g *mpiGroup) Broadcast(t *tensor.Tensor, root int) error {
	return g.BroadcastAsync(t, root).Wait()
}

func (g *mpiGroup) BroadcastAsync(t *tensor.Tensor, root int) Handle {
	const name = "broadcast"
	if err := checkTensors(t); err != nil {
		return g.reject(name, err)
	}
	if err := checkRoot(root, len(g.ranks)); err != nil {
		return g.reject(name, err)
	}
	dt, buf := t.DType(), bytesOf(t)
	return g.start(name, func(req *C.uint64_t) C.int {
		return C.tac_ibcast(bufPtr(buf), C.int(t.Numel()), mpiDType(dt), C.int(root), g.comm, req)
	}, nil, t)
}

func (g *mpiGroup) Reduce(t *tensor.Tensor, root int, op ReduceOp) error {
	return g.ReduceAsync(t, root, op).Wait()
}

func (g *mpiGroup) ReduceAsync(t *tensor.Tensor, root int, op ReduceOp) Handle {
	const name = "reduce"
	if err := checkReduceArgs(t, op); err != nil {
		return g.reject(name, err)
	}
	if err := checkRoot(root, len(g.ranks)); err != nil {
		return g.reject(name, err)
	}
	dt, buf := t.DType(), bytesOf(t)
	isRoot := C.int(0)
	var finish func()
	if root == g.me {
		isRoot, finish = 1, g.avgFinish(op, dt, buf)
	}
	if isHalf(dt) {
		w, _, wfinish := g.mpiWide(op, dt, buf, buf, t.Numel())
		if root != g.me {
			wfinish = nil
		}
		return g.start(name, func(req *C.uint64_t) C.int {
			return C.tac_ireduce(bufPtr(f32Bytes(w)), C.int(len(w)), mpiDType(tensor.Float32), mpiOp(op), C.int(root), isRoot, g.comm, req)
		}, wfinish, t, w)
	}
	return g.start(name, func(req *C.uint64_t) C.int {
		return C.tac_ireduce(bufPtr(buf), C.int(t.Numel()), mpiDType(dt), mpiOp(op), C.int(root), isRoot, g.comm, req)
	}, finish, t)
}

func (g *mpiGroup) Barrier() error {
	return g.start("barrier", func(req *C.uint64_t) C.int { return C.tac_ibarrier(g.comm, req) }, nil).Wait()
}

func (g *mpiGroup) Send(t *tensor.Tensor, to int) error { return g.SendAsync(t, to).Wait() }

// SendAsync is eager like the tcp backend's: the data is copied into C
// memory and the send completes once MPI has it; MPI delivers it while the
// caller goes on (a ring of Send-then-Recv does not deadlock).
func (g *mpiGroup) SendAsync(t *tensor.Tensor, to int) Handle {
	name := "send"
	if err := checkPeerArgs(t, to, g.me, len(g.ranks)); err != nil {
		return g.reject(name, err)
	}
	name = fmt.Sprintf("send to rank %d", g.ranks[to])
	dt, buf := t.DType(), bytesOf(t)
	var copyBuf unsafe.Pointer
	if len(buf) > 0 {
		copyBuf = C.malloc(C.size_t(len(buf)))
		copy(unsafe.Slice((*byte)(copyBuf), len(buf)), buf)
	}
	h := g.startOp(name, true, func(req *C.uint64_t) C.int {
		return C.tac_isend(copyBuf, C.int(t.Numel()), mpiDType(dt), C.int(to), g.comm, req)
	}, func() { C.free(copyBuf) })
	if _, ok := h.(failed); ok {
		C.free(copyBuf)
	}
	return h
}

func (g *mpiGroup) Recv(t *tensor.Tensor, from int) error { return g.RecvAsync(t, from).Wait() }

func (g *mpiGroup) RecvAsync(t *tensor.Tensor, from int) Handle {
	name := "recv"
	if err := checkPeerArgs(t, from, g.me, len(g.ranks)); err != nil {
		return g.reject(name, err)
	}
	name = fmt.Sprintf("recv from rank %d", g.ranks[from])
	dt, buf := t.DType(), bytesOf(t)
	return g.start(name, func(req *C.uint64_t) C.int {
		return C.tac_irecv(bufPtr(buf), C.int(t.Numel()), mpiDType(dt), C.int(from), g.comm, req)
	}, nil, t)
}

func (g *mpiGroup) NewGroup(ranks []int) (Group, error) {
	return g.NewNamedGroup(subGroupName(g.name, ranks), ranks)
}

// NewNamedGroup makes an MPI communicator with MPI_Comm_split, which blocks:
// a non-blocking barrier with the deadline goes first, so a rank that never
// calls is reported instead of hanging the others.
func (g *mpiGroup) NewNamedGroup(name string, ranks []int) (Group, error) {
	me, world, err := checkSubGroup(name, g.name, g.ranks, g.me, ranks)
	if err != nil {
		return nil, err
	}
	if err := g.start("new_group "+name, func(req *C.uint64_t) C.int { return C.tac_ibarrier(g.comm, req) }, nil).Wait(); err != nil {
		return nil, err
	}
	color, key := C.tac_undefined(), C.int(0)
	if me >= 0 {
		color, key = 0, C.int(me)
	}
	var sub C.uint64_t
	g.e.do(func() { err = mpiError(C.tac_split(g.comm, color, key, &sub)) })
	if err != nil {
		return nil, fmt.Errorf("comm: new group %q of group %q: MPI_Comm_split: %w", name, g.name, err)
	}
	if me < 0 {
		return nil, nil
	}
	sg := &mpiGroup{e: g.e, comm: sub, name: name, me: me, ranks: world, opts: g.opts}
	g.e.addGroup(sg)
	return sg, nil
}

// Close waits for this group's operations (a barrier queued behind them
// would also wait for the other ranks, so it polls the engine instead),
// frees the communicator, and for the world finalizes MPI.
func (g *mpiGroup) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	g.mu.Unlock()
	deadline := time.Now().Add(g.opts.Timeout)
	for {
		busy := false
		g.e.do(func() {
			for _, p := range g.e.pending {
				if p.o.g == g {
					busy = true
				}
			}
		})
		if !busy || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if !g.isWorld {
		g.e.do(func() { C.tac_free(&g.comm) })
		return nil
	}
	if w := g.e.watch.Load(); w != nil {
		w.close(g.opts.Timeout)
	}
	mpiMu.Lock()
	defer mpiMu.Unlock()
	close(g.e.stop)
	<-g.e.done
	mpiTheEng, mpiFinished = nil, true
	return nil
}
