package comm

import (
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"
)

// The local backend runs every rank as a goroutine of one process. It shares
// the collectives of the tcp backend (only the transport differs), so the
// tests of every plugin exercise the same algorithms as a real job, with the
// race detector watching.

type localNet struct {
	ranks []*localRank
}

type localRank struct {
	net   *localNet
	rank  int
	box   *mailbox
	world *world

	mu     sync.Mutex
	closed bool
}

func (l *localRank) inbox() *mailbox { return l.box }

// send copies payload into the peer's mailbox; the copy is what lets the
// sender reuse its buffer at once (eager delivery).
func (l *localRank) send(peer int, h *header, payload []byte, _ time.Time) error {
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return fmt.Errorf("rank %d: this rank closed its connections", l.rank)
	}
	dst := l.net.ranks[peer]
	bp, data := dst.box.pool.get(len(payload))
	copy(data, payload)
	dst.box.put(boxKey{src: l.rank, group: h.group, ch: h.ch}, message{h: *h, data: data, buf: bp})
	return nil
}

func (l *localRank) probe(peer int, gid uint64, _ time.Time) (uint64, error) {
	return l.net.ranks[peer].world.progress(gid), nil
}

func (l *localRank) notify(peer int, n *abortNote, _ time.Time) {
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return // a crashed process tells nobody anything
	}
	l.net.ranks[peer].box.addNote(l.rank, n)
}

func (l *localRank) close(orderly bool) error {
	l.leave(orderly, "stopped (closed its connections)")
	return nil
}

func (l *localRank) leave(orderly bool, why string) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	l.mu.Unlock()
	for _, p := range l.net.ranks {
		if p.rank == l.rank {
			continue
		}
		if orderly {
			p.box.markGone(l.rank)
		} else {
			p.box.markDead(l.rank, why)
		}
	}
}

// NewLocal returns the world groups of n ranks that live in this process,
// one per rank, to be used from n goroutines. RunLocal is the usual entry.
func NewLocal(n int, opts Options) ([]Group, error) {
	if n < 1 {
		return nil, fmt.Errorf("comm: local world of %d ranks: need at least 1", n)
	}
	opts = opts.withDefaults()
	net := &localNet{ranks: make([]*localRank, n)}
	groups := make([]Group, n)
	for r := range n {
		lr := &localRank{net: net, rank: r, box: newMailbox(opts.ChunkBytes)}
		net.ranks[r] = lr
		w, g := newWorld(lr, r, n, opts)
		lr.world = w
		groups[r] = g
	}
	return groups, nil
}

// RunLocal runs fn on n goroutine ranks sharing one process and returns the
// ranks' errors joined, each prefixed with its rank. A rank whose fn fails
// (or panics) counts as dead, so ranks waiting on it fail promptly instead
// of waiting for the timeout. Every world group is closed afterwards.
func RunLocal(n int, opts Options, fn func(g Group) error) error {
	groups, err := NewLocal(n, opts)
	if err != nil {
		return err
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			g := groups[r].(*group)
			lr := g.w.tr.(*localRank)
			err := runGuarded(g, fn)
			if err != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, err)
				lr.leave(false, "failed: "+err.Error())
			}
			if cerr := g.Close(); cerr != nil && errs[r] == nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, cerr)
			}
		}(r)
	}
	wg.Wait()
	return errors.Join(errs...)
}

func runGuarded(g Group, fn func(g Group) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v\n%s", p, debug.Stack())
		}
	}()
	return fn(g)
}
