package comm

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// transport moves tagged chunks between the ranks of one world. Everything a
// backend must provide is here; the collectives are written against it.
type transport interface {
	// send delivers one chunk to world rank peer. It returns once the
	// payload may be reused; the receiver buffers it if no one waits yet.
	send(peer int, h *header, payload []byte, deadline time.Time) error
	// inbox is where chunks for this rank arrive.
	inbox() *mailbox
	// probe asks peer for the last collective it started on group gid.
	probe(peer int, gid uint64, deadline time.Time) (uint64, error)
	// notify tells peer that this rank gave up an operation (see abortNote).
	notify(peer int, n *abortNote, deadline time.Time)
	// close leaves the job: orderly (peers see "left") or as a crash would.
	close(orderly bool) error
}

// abortNote is what a rank that gave up a collective tells the rest of the
// group. It wakes ranks that wait on someone who is itself waiting (a ring
// neighbour only sees its neighbour), and it tells them that its sender did
// arrive, so a rank that exits after failing is not blamed for the failure.
type abortNote struct {
	Group   uint64   `msgpack:"group"`
	Seq     uint64   `msgpack:"seq"`
	Missing []int    `msgpack:"missing"`
	Details []string `msgpack:"details"`
	Reason  string   `msgpack:"reason"`
}

type noteKey struct {
	peer  int
	group uint64
}

// Channels keep the message streams of one group apart.
const (
	chColl  uint16 = 1 // collectives, in group sequence order
	chP2P   uint16 = 2 // send/recv, in per-pair sequence order
	chDebug uint16 = 3 // fingerprints of Debug mode
	chProbe uint16 = 4 // probe replies
)

// boxKey names one FIFO stream: frames from one sender on one group channel
// arrive in order because each sender writes them in order.
type boxKey struct {
	src   int
	group uint64
	ch    uint16
}

// message is one received chunk. buf is returned to the pool by release.
type message struct {
	h    header
	data []byte
	buf  *[]byte
}

type boxQueue struct {
	msgs   []message
	notify chan struct{} // capacity 1: "something was queued"
}

// mailbox holds the chunks that arrived for one rank and the state of its
// peers (dead or gone), so a waiting receiver wakes on either.
type mailbox struct {
	mu      sync.Mutex
	queues  map[boxKey]*boxQueue
	dead    map[int]string // peer -> why it is considered dead
	gone    map[int]bool   // peer closed in order
	notes   map[noteKey]*abortNote
	changed chan struct{} // closed and replaced when dead/gone changes
	pool    *bufPool
}

func newMailbox(chunk int) *mailbox {
	return &mailbox{
		queues:  map[boxKey]*boxQueue{},
		dead:    map[int]string{},
		gone:    map[int]bool{},
		notes:   map[noteKey]*abortNote{},
		changed: make(chan struct{}),
		pool:    &bufPool{size: chunk},
	}
}

func (m *mailbox) queue(k boxKey) *boxQueue {
	q := m.queues[k]
	if q == nil {
		q = &boxQueue{notify: make(chan struct{}, 1)}
		m.queues[k] = q
	}
	return q
}

func (m *mailbox) put(k boxKey, msg message) {
	m.mu.Lock()
	q := m.queue(k)
	q.msgs = append(q.msgs, msg)
	m.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// markDead records that peer failed; receivers of groups that include it
// give up at once instead of waiting for their deadline.
func (m *mailbox) markDead(peer int, why string) {
	m.mu.Lock()
	if _, ok := m.dead[peer]; !ok && !m.gone[peer] {
		m.dead[peer] = why
		close(m.changed)
		m.changed = make(chan struct{})
	}
	m.mu.Unlock()
}

func (m *mailbox) markGone(peer int) {
	m.mu.Lock()
	if !m.gone[peer] {
		m.gone[peer] = true
		close(m.changed)
		m.changed = make(chan struct{})
	}
	m.mu.Unlock()
}

func (m *mailbox) addNote(peer int, n *abortNote) {
	m.mu.Lock()
	m.notes[noteKey{peer, n.Group}] = n
	close(m.changed)
	m.changed = make(chan struct{})
	m.mu.Unlock()
}

func (m *mailbox) note(peer int, gid uint64) *abortNote {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.notes[noteKey{peer, gid}]
}

func (m *mailbox) deadReason(peer int) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if why, ok := m.dead[peer]; ok {
		return why, true
	}
	if m.gone[peer] {
		return "left the job (closed its connections)", true
	}
	return "", false
}

// waitError says why take gave up.
type waitError struct {
	peer    int  // world rank waited on, or that failed
	timeout bool // the deadline passed
	why     string
	note    *abortNote // set when a member gave up
}

func (e *waitError) Error() string {
	if e.timeout {
		return fmt.Sprintf("timed out waiting for rank %d", e.peer)
	}
	if e.note != nil {
		return fmt.Sprintf("rank %d gave up: %s", e.peer, e.note.Reason)
	}
	return fmt.Sprintf("rank %d: %s", e.peer, e.why)
}

// take returns the next chunk of stream k. It fails when the deadline
// passes, when the sender is dead or left with nothing queued, and when a
// world rank in watch gave up an operation of this group (abortNote).
func (m *mailbox) take(k boxKey, deadline time.Time, watch []int) (message, error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		m.mu.Lock()
		q := m.queue(k)
		if len(q.msgs) > 0 {
			msg := q.msgs[0]
			q.msgs[0] = message{}
			q.msgs = q.msgs[1:]
			if len(q.msgs) == 0 {
				q.msgs = nil
			}
			m.mu.Unlock()
			return msg, nil
		}
		if why, ok := m.dead[k.src]; ok {
			m.mu.Unlock()
			return message{}, &waitError{peer: k.src, why: why}
		}
		for _, w := range watch {
			if n := m.notes[noteKey{w, k.group}]; n != nil {
				m.mu.Unlock()
				return message{}, &waitError{peer: w, note: n}
			}
		}
		if m.gone[k.src] {
			m.mu.Unlock()
			return message{}, &waitError{peer: k.src, why: "left the job (closed its connections)"}
		}
		notify, changed := q.notify, m.changed
		m.mu.Unlock()
		d := time.Until(deadline)
		if d <= 0 {
			return message{}, &waitError{peer: k.src, timeout: true}
		}
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-notify:
		case <-changed:
		case <-timer.C:
			timer = nil
		}
	}
}

func (m *mailbox) release(msg message) {
	if msg.buf != nil {
		m.pool.put(msg.buf)
	}
}

// bufPool recycles chunk buffers so streaming a large tensor does not churn
// the garbage collector.
type bufPool struct {
	size int
	p    sync.Pool
}

// get returns a buffer of n bytes; pooled when n fits a chunk.
func (b *bufPool) get(n int) (*[]byte, []byte) {
	if n > b.size {
		s := make([]byte, n)
		return nil, s
	}
	if v := b.p.Get(); v != nil {
		bp := v.(*[]byte)
		return bp, (*bp)[:n]
	}
	s := make([]byte, b.size)
	return &s, s[:n]
}

func (b *bufPool) put(bp *[]byte) { b.p.Put(bp) }

var errClosed = errors.New("comm: group is closed")
