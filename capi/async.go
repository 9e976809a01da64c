package main

import (
	"sync"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// Started collectives: a collective of the world group that runs on a
// library goroutine while the caller goes on computing (ZeRO-2's gradient
// reduce-scatter, started from a backward hook), waited for later.
//
// Ranks must issue collectives in the same order, so started collectives
// run strictly one after another, in the order they were started: each
// waits for the one started before it. A blocking collective called while
// some are still running could take the world group before them on one
// rank and after them on another, so the caller waits for every started
// one first (tinyacc.h says so). The caller's memory is borrowed until the
// wait returns; each collective is bounded by the world group's deadline,
// so a wait always returns.

// pendingObj is one started collective.
type pendingObj struct {
	done chan struct{} // closed when the collective has finished
	err  error
}

// lastStarted is the most recently started collective, which the next one
// waits for.
var lastStarted struct {
	sync.Mutex
	p *pendingObj
}

// start runs fn on the world group after every collective started before
// it and returns its handle.
func start(fn func(g comm.Group) error) int64 {
	p := &pendingObj{done: make(chan struct{})}
	lastStarted.Lock()
	prev := lastStarted.p
	lastStarted.p = p
	lastStarted.Unlock()
	go func() {
		if prev != nil {
			<-prev.done
		}
		p.err = withWorld(fn)
		close(p.done)
	}()
	return register(p)
}

// apiReduceScatterStart starts reduceScatter(in, out, op) and returns its
// handle. The arguments that need no world size are refused here, before
// anything starts; the length of in against the world size is checked when
// it runs, and reported by the wait.
func apiReduceScatterStart(in, out []float32, op int) (int64, error) {
	if _, err := reduceOp(op); err != nil {
		return 0, err
	}
	if len(out) == 0 {
		return 0, fail(errInvalidArg, "reduce_scatter_start: the output needs at least one element")
	}
	return start(func(g comm.Group) error { return reduceScatter(g, in, out, op) }), nil
}

// apiReduceScatterStartAs is apiReduceScatterStart with the wire in dtype
// dt (reduceScatterAs).
func apiReduceScatterStartAs(in, out []float32, op int, dt tensor.DType) (int64, error) {
	if _, err := reduceOp(op); err != nil {
		return 0, err
	}
	if len(out) == 0 {
		return 0, fail(errInvalidArg, "reduce_scatter_start_as: the output needs at least one element")
	}
	return start(func(g comm.Group) error { return reduceScatterAs(g, in, out, op, dt) }), nil
}

// apiCollectiveWait blocks until the started collective h has finished,
// frees h and returns the collective's error.
func apiCollectiveWait(h int64) error {
	p, err := get[pendingObj](h)
	if err != nil {
		return err
	}
	<-p.done
	if err := freeHandle(h); err != nil {
		return err
	}
	return p.err
}
