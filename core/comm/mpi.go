//go:build cgo && linux

package comm

/*
#include <stdint.h>
#include <stdlib.h>
int tac_init(int*);
int tac_finalize(void);
uint64_t tac_world_comm(void);
int tac_rank(uint64_t, int*);
int tac_size(uint64_t, int*);
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
int tac_test(uint64_t*, int*);
int tac_undefined(void);
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The mpi backend hands every operation to MPI's non-blocking collectives
// and point-to-point calls. All MPI calls run on one goroutine locked to its
// OS thread (the engine), the thread that initialized MPI, so MPI needs no
// thread support beyond MPI_THREAD_FUNNELED. The engine starts operations in
// the order they were issued, which on every rank is the same order per
// communicator, and polls the pending ones against their deadlines.

func init() { RegisterBackend("mpi", newMPIFromEnv) }

// mpiEngine owns MPI for this process.
type mpiEngine struct {
	calls   chan func()
	pending []*mpiPending
	stop    chan struct{}
	done    chan struct{}

	watch  atomic.Pointer[mpiWatch] // the side channel, once open (mpi_watch.go)
	mu     sync.Mutex
	groups []*mpiGroup // every group of this rank, for its published progress
}

// addGroup registers g for the progress this rank publishes.
func (e *mpiEngine) addGroup(g *mpiGroup) {
	e.mu.Lock()
	e.groups = append(e.groups, g)
	e.mu.Unlock()
}

// progress is the last sequence number started on each group.
func (e *mpiEngine) progress() string {
	e.mu.Lock()
	groups := slices.Clone(e.groups)
	e.mu.Unlock()
	seqs := map[string]uint64{}
	for _, g := range groups {
		g.mu.Lock()
		seqs[g.name] = g.seq
		g.mu.Unlock()
	}
	return formatProgress(seqs)
}

// mpiPending is a started request: finish runs on the engine when it
// completes; keep holds what MPI still reads or writes.
type mpiPending struct {
	req      C.uint64_t
	deadline time.Time
	o        *mpiOpState
	finish   func()
	keep     []any
}

// mpiOpState is an operation in flight; it is its own Handle.
type mpiOpState struct {
	g    *mpiGroup
	name string
	seq  uint64
	done chan struct{}
	err  error
}

func (o *mpiOpState) Wait() error {
	<-o.done
	return o.err
}

var (
	mpiMu       sync.Mutex
	mpiTheEng   *mpiEngine
	mpiFinished bool
)

// do runs f on the engine thread and waits for it.
func (e *mpiEngine) do(f func()) {
	ch := make(chan struct{})
	e.calls <- func() { f(); close(ch) }
	<-ch
}

func (e *mpiEngine) loop(ready chan<- error) {
	runtime.LockOSThread() // MPI's thread for the rest of the process
	defer close(e.done)
	var provided C.int
	if err := mpiError(C.tac_init(&provided)); err != nil {
		ready <- fmt.Errorf("comm: MPI_Init_thread: %w", err)
		return
	}
	ready <- nil
	idle := time.NewTimer(time.Hour)
	for {
		if len(e.pending) == 0 {
			select {
			case f := <-e.calls:
				f()
			case <-e.stop:
				C.tac_finalize()
				return
			}
			continue
		}
		// Take new work first, then poll what is in flight. Requests
		// left at close (timed out, never to finish) do not hold it up.
		for more := true; more; {
			select {
			case f := <-e.calls:
				f()
			case <-e.stop:
				C.tac_finalize()
				return
			default:
				more = false
			}
		}
		if !e.poll() {
			idle.Reset(20 * time.Microsecond)
			select {
			case f := <-e.calls:
				f()
			case <-idle.C:
			}
			idle.Stop()
		}
	}
}

// poll tests every pending request once; it reports whether any finished.
func (e *mpiEngine) poll() bool {
	w := e.watch.Load()
	if w != nil {
		if d := w.failure(); d != nil {
			e.failAll(d)
			return true
		}
	}
	progressed := false
	now := time.Now()
	kept := e.pending[:0]
	for _, p := range e.pending {
		var flag C.int
		rc := C.tac_test(&p.req, &flag)
		switch {
		case rc != 0:
			p.o.fail(fmt.Errorf("comm: %s on group %q seq %d failed: %w", p.o.name, p.o.g.name, p.o.seq, mpiError(rc)))
			progressed = true
		case flag != 0:
			if p.finish != nil {
				p.finish()
			}
			p.o.complete()
			progressed = true
		case now.After(p.deadline):
			// MPI cannot cancel a collective: its buffers stay MPI's, so
			// they are kept referenced, and the group is broken.
			p.o.g.leak(p.keep)
			base := fmt.Sprintf("comm: %s on group %q seq %d did not finish within %s on the mpi backend",
				p.o.name, p.o.g.name, p.o.seq, p.o.g.opts.Timeout)
			if w == nil {
				p.o.fail(fmt.Errorf("%s (MPI does not say which ranks are missing)", base))
			} else {
				// Asking the side channel takes a moment: the group
				// is broken now, the operation fails once it is known
				// who is missing.
				o := p.o
				o.g.breakWith(errors.New(base))
				go func() { o.fail(fmt.Errorf("%s: %s", base, w.missing(o.g.name, o.seq))) }()
			}
			progressed = true
		default:
			kept = append(kept, p)
		}
	}
	clear(e.pending[len(kept):])
	e.pending = kept
	return progressed
}

// failAll fails every pending operation because rank d.rank left: MPI
// would wait for it until the deadline, or until mpirun ends the job
// without a word from tinyacc.
func (e *mpiEngine) failAll(d *mpiDeath) {
	for _, p := range e.pending {
		g := p.o.g
		g.leak(p.keep)
		head := fmt.Sprintf("comm: %s on group %q seq %d failed after %s on the mpi backend",
			p.o.name, g.name, p.o.seq, time.Since(p.deadline.Add(-g.opts.Timeout)).Round(time.Millisecond))
		if slices.Contains(g.ranks, d.rank) {
			p.o.fail(fmt.Errorf("%s: ranks [%d] did not arrive (rank %d: %s)", head, d.rank, d.rank, d.why))
		} else {
			// MPI cannot go on once any rank of the job is gone.
			p.o.fail(fmt.Errorf("%s: rank %d of the job, outside this group, left: %s", head, d.rank, d.why))
		}
	}
	clear(e.pending)
	e.pending = e.pending[:0]
}

func (o *mpiOpState) complete() { close(o.done) }

// breakWith marks the group failed, unless it already is.
func (g *mpiGroup) breakWith(err error) {
	g.mu.Lock()
	if g.broken == nil {
		g.broken = err
	}
	g.mu.Unlock()
}

func (o *mpiOpState) fail(err error) {
	o.err = err
	o.g.mu.Lock()
	if o.g.broken == nil {
		o.g.broken = err
	}
	o.g.mu.Unlock()
	close(o.done)
}

// newMPIFromEnv initializes MPI (once per process) and returns its world.
func newMPIFromEnv(env EnvInfo, opts Options) (Group, error) {
	opts = opts.withDefaults()
	if err := loadMPI(); err != nil {
		return nil, err
	}
	mpiMu.Lock()
	defer mpiMu.Unlock()
	if mpiFinished || mpiTheEng != nil {
		return nil, fmt.Errorf("comm: mpi backend: %w", errMPIFinalized)
	}
	e := &mpiEngine{calls: make(chan func()), stop: make(chan struct{}), done: make(chan struct{})}
	ready := make(chan error, 1)
	go e.loop(ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	mpiTheEng = e
	var rank, size C.int
	var err error
	e.do(func() {
		w := C.tac_world_comm()
		if err = mpiError(C.tac_rank(w, &rank)); err == nil {
			err = mpiError(C.tac_size(w, &size))
		}
	})
	if err != nil {
		return nil, fmt.Errorf("comm: mpi backend: %w", err)
	}
	if env.Source != "single" && (int(rank) != env.Rank || int(size) != env.Size) {
		return nil, fmt.Errorf("comm: mpi backend: MPI says rank %d of %d but the %s variables say rank %d of %d; start the job with mpirun or srun alone",
			rank, size, env.Source, env.Rank, env.Size)
	}
	world := make([]int, size)
	for i := range world {
		world[i] = i
	}
	g := &mpiGroup{e: e, comm: C.tac_world_comm(), name: "world", me: int(rank), ranks: world, opts: opts, isWorld: true}
	e.addGroup(g)
	env.Rank, env.Size = int(rank), int(size)
	w, err := startMPIWatch(env, opts, g, e.progress)
	if err != nil {
		_ = g.Close()
		return nil, err
	}
	// The side channel's setup is none of the caller's operations: the
	// first of those is seq 1, as on the other backends.
	g.mu.Lock()
	g.seq = 0
	g.mu.Unlock()
	if w != nil {
		e.watch.Store(w)
	}
	return g, nil
}
