// Package commtest holds a test double of comm.Group for the tests of the
// plugins that claim to overlap communication with computation. Nothing
// outside tests uses it.
package commtest

import (
	"fmt"
	"sync"
	"time"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// Kinds of operation a Gate can withhold.
const (
	AllReduce     = "all_reduce"
	ReduceScatter = "reduce_scatter"
	Send          = "send"
	Recv          = "recv"
)

// Gate wraps a group so that the operations of the chosen kinds, issued
// while it is armed, do not complete until the test calls Open: the data
// moves as usual underneath, but Wait (and the blocking forms) return only
// once Open has run after their issue. A test opens the gate from the
// computation the operations should overlap (a trainer hook, a compute
// callback), so an implementation that waits for an operation before doing
// that computation never sees it complete: its wait ends with an error
// after the deadline instead of hanging, and Err reports it too.
type Gate struct {
	comm.Group
	deadline time.Duration
	kinds    map[string]bool

	mu      sync.Mutex
	armed   bool
	release chan struct{} // closed by the next Open
	held    int           // operations waiting for the next Open
	expired chan struct{} // closed at the first expiry: later ones fail at once
	err     error
}

// NewGate wraps g; operations of the given kinds issued while the gate is
// armed are withheld until the next Open, or fail after deadline.
func NewGate(g comm.Group, deadline time.Duration, kinds ...string) *Gate {
	k := map[string]bool{}
	for _, s := range kinds {
		k[s] = true
	}
	return &Gate{Group: g, deadline: deadline, kinds: k,
		release: make(chan struct{}), expired: make(chan struct{})}
}

// Arm makes the gate withhold the operations issued from now on.
func (g *Gate) Arm() {
	g.mu.Lock()
	g.armed = true
	g.mu.Unlock()
}

// Open lets every withheld operation complete and returns how many were
// withheld since the previous Open. With disarm, operations issued from
// now on pass straight through until the next Arm.
func (g *Gate) Open(disarm bool) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	close(g.release)
	g.release = make(chan struct{})
	n := g.held
	g.held = 0
	if disarm {
		g.armed = false
	}
	return n
}

// Err is the first expiry: an operation whose caller waited for it before
// the gate was opened.
func (g *Gate) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// held is a withheld operation's Handle.
type held struct {
	done chan struct{}
	err  error
}

func (h *held) Wait() error {
	<-h.done
	return h.err
}

// wrap withholds h when the gate is armed and kind is gated.
func (g *Gate) wrap(kind string, h comm.Handle) comm.Handle {
	g.mu.Lock()
	if !g.armed || !g.kinds[kind] {
		g.mu.Unlock()
		return h
	}
	g.held++
	rel := g.release
	g.mu.Unlock()
	w := &held{done: make(chan struct{})}
	timer := time.NewTimer(g.deadline)
	go func() {
		defer close(w.done)
		defer timer.Stop()
		w.err = h.Wait()
		select {
		case <-rel:
			return
		case <-g.expired:
		case <-timer.C:
		}
		select {
		case <-rel: // opened in time after all
			return
		default:
		}
		err := fmt.Errorf("commtest: rank %d of group %s: %s withheld until the computation it should overlap has run (Gate.Open), which did not happen within %v: the caller waited for it first",
			g.Rank(), g.Name(), kind, g.deadline)
		g.mu.Lock()
		if g.err == nil {
			g.err = err
			close(g.expired)
		}
		g.mu.Unlock()
		w.err = err
	}()
	return w
}

// The gated operations, asynchronous and blocking (a blocking call is the
// asynchronous one waited for, so it is withheld the same way).

func (g *Gate) AllReduceAsync(t *tensor.Tensor, op comm.ReduceOp) comm.Handle {
	return g.wrap(AllReduce, g.Group.AllReduceAsync(t, op))
}

func (g *Gate) AllReduce(t *tensor.Tensor, op comm.ReduceOp) error {
	return g.AllReduceAsync(t, op).Wait()
}

func (g *Gate) ReduceScatterAsync(in, out *tensor.Tensor, op comm.ReduceOp) comm.Handle {
	return g.wrap(ReduceScatter, g.Group.ReduceScatterAsync(in, out, op))
}

func (g *Gate) ReduceScatter(in, out *tensor.Tensor, op comm.ReduceOp) error {
	return g.ReduceScatterAsync(in, out, op).Wait()
}

func (g *Gate) SendAsync(t *tensor.Tensor, to int) comm.Handle {
	return g.wrap(Send, g.Group.SendAsync(t, to))
}

func (g *Gate) Send(t *tensor.Tensor, to int) error { return g.SendAsync(t, to).Wait() }

func (g *Gate) RecvAsync(t *tensor.Tensor, from int) comm.Handle {
	return g.wrap(Recv, g.Group.RecvAsync(t, from))
}

func (g *Gate) Recv(t *tensor.Tensor, from int) error { return g.RecvAsync(t, from).Wait() }
