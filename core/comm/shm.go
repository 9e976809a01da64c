//go:build linux

package comm

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// Ranks on one host move the payload of data frames through shared memory
// instead of loopback TCP: loopback costs two kernel copies plus the socket
// machinery per byte, which on a busy host is most of a collective's time.
// Everything else stays on the TCP connection: the frame header still goes
// there (so ordering, tags, dead-peer detection, probes and abort notes are
// unchanged) and merely says, with flagShm, that its payload lies in the
// ring instead of following it.
//
// Each directed pair of same-host ranks has one ring, a file under /dev/shm
// that the receiver creates and both map. The sender copies a payload into
// the ring, then writes the header; the receiver's reader copies the payload
// out when the header arrives and hands the space back by advancing the
// ring's tail, an atomic counter in the mapped first page. The position of
// each payload is not sent: both sides place frames by the same rule, in the
// same order, so the receiver can compute it.
//
// The receiver's reader always drains the ring (the mailbox is unbounded, as
// with TCP), so a sender waits for space only while the receiver is slow or
// dead; it sleeps on a futex in the mapped page and re-checks the deadline
// and the peer's state every shmPoll.

const (
	// shmHeaderBytes is the first page of a ring: tail (uint64 at 0), the
	// wake sequence the sender sleeps on (uint32 at 8) and the sender's
	// "waiting" flag (uint32 at 12).
	shmHeaderBytes = 4096
	// shmMinRing and shmMaxRing bound the data area: a few chunks in flight
	// per pair keep both sides busy; more only costs host memory, which is
	// n*(n-1) rings for n ranks on a host.
	shmMinRing = 2 << 20
	shmMaxRing = 16 << 20
	// shmPoll is how often a sender waiting for space looks at the deadline
	// and whether the receiver died.
	shmPoll = 20 * time.Millisecond
)

// shmDir holds the ring files; tmpfs, so they are plain memory. A variable
// so tests can point it where creating a ring fails.
var shmDir = "/dev/shm"

// shmRing is one direction of a same-host pair, as mapped by one side.
type shmRing struct {
	peer int    // world rank on the other side
	mem  []byte // the whole mapping
	data []byte // mem[shmHeaderBytes:]
	// head counts the bytes placed so far, padding included. The sender
	// owns it under its connection's write lock; the receiver keeps its own
	// copy, advanced by the reader goroutine only.
	head uint64
	path string // receiver only: the file, until it is unlinked
	// onWait, when set (tests), runs once each time a sender starts waiting
	// for space.
	onWait func()
}

func (r *shmRing) tail() *atomic.Uint64 { return (*atomic.Uint64)(unsafe.Pointer(&r.mem[0])) }
func (r *shmRing) wakeSeq() *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&r.mem[8]))
}
func (r *shmRing) waiting() *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&r.mem[12]))
}

// fits says whether a payload of n bytes may use the ring: larger ones
// would leave no room to pipeline, so they take TCP.
func (r *shmRing) fits(n int) bool { return n > 0 && n <= len(r.data)/2 }

// place returns the span [start, end) of ring counter space that a payload
// of n bytes written at head occupies. A payload never wraps: when it does
// not fit before the end of the ring it starts at the beginning, and the
// skipped bytes count as used. Spans are 8-byte aligned.
func (r *shmRing) place(head uint64, n int) (start, end uint64) {
	c := uint64(len(r.data))
	if head%c+uint64(n) > c {
		head += c - head%c
	}
	return head, head + (uint64(n)+7)&^7
}

// write copies payload into the ring, waiting for space until deadline or
// until alive reports the receiver gone. It returns the head to commit once
// the header is on its way; until then the receiver does not look.
func (r *shmRing) write(payload []byte, deadline time.Time, alive func() error) (uint64, error) {
	start, end := r.place(r.head, len(payload))
	c := uint64(len(r.data))
	waited := false
	for end-r.tail().Load() > c {
		if err := alive(); err != nil {
			return 0, err
		}
		d := time.Until(deadline)
		if d <= 0 {
			return 0, &waitError{peer: r.peer, timeout: true}
		}
		if !waited && r.onWait != nil {
			r.onWait()
		}
		waited = true
		// Announce the wait, then look again: the receiver advances the
		// tail before it bumps the sequence and reads the flag, so either
		// this look sees the space or the receiver sees the flag and wakes
		// the futex (which returns at once if the sequence moved).
		seq := r.wakeSeq().Load()
		r.waiting().Store(1)
		if end-r.tail().Load() <= c {
			r.waiting().Store(0)
			break
		}
		futexWait(r.wakeSeq(), seq, min(d, shmPoll))
		r.waiting().Store(0)
	}
	pos := start % c
	copy(r.data[pos:pos+uint64(len(payload))], payload)
	return end, nil
}

// readShm fills dst with the next payload from peer's ring; the reader of
// peer's connection calls it for frames flagged flagShm.
func (t *tcpTransport) readShm(peer int, dst []byte) error {
	if t.shmIn == nil || t.shmIn[peer] == nil {
		return fmt.Errorf("%w: rank %d sent a shared-memory payload but has no ring to this rank", errFrame, peer)
	}
	return t.shmIn[peer].read(dst)
}

// read copies the next payload (n bytes) out of the ring into dst and
// returns its space to the sender.
func (r *shmRing) read(dst []byte) error {
	n := len(dst)
	if n > len(r.data) {
		return fmt.Errorf("%w: shared-memory payload of %d bytes exceeds the ring of %d", errFrame, n, len(r.data))
	}
	start, end := r.place(r.head, n)
	pos := start % uint64(len(r.data))
	copy(dst, r.data[pos:pos+uint64(n)])
	r.head = end
	r.tail().Store(end)
	r.wakeSeq().Add(1)
	if r.waiting().Load() != 0 {
		futexWake(r.wakeSeq())
	}
	return nil
}

func (r *shmRing) unlink() {
	if r.path != "" {
		_ = syscall.Unlink(r.path)
		r.path = ""
	}
}

func (r *shmRing) unmap() {
	r.unlink()
	if r.mem != nil {
		_ = syscall.Munmap(r.mem)
		r.mem, r.data = nil, nil
	}
}

// futexWait sleeps until *addr is woken, no longer holds val, or d passed.
// The futex is process-shared (no FUTEX_PRIVATE_FLAG): the waker is the
// receiver's process.
func futexWait(addr *atomic.Uint32, val uint32, d time.Duration) {
	const futexWaitOp = 0
	ts := syscall.NsecToTimespec(int64(d))
	_, _, _ = syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWaitOp, uintptr(val),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
}

func futexWake(addr *atomic.Uint32) {
	const futexWakeOp = 1
	_, _, _ = syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWakeOp, 1, 0, 0, 0)
}

// sendShm sends one data frame whose payload goes through ring r. The
// caller holds the connection's write lock, which keeps ring order and
// frame order the same.
func (t *tcpTransport) sendShm(pc *peerConn, r *shmRing, h *header, payload []byte, deadline time.Time) error {
	end, err := r.write(payload, deadline, func() error { return t.peerFailure(pc.rank) })
	if err != nil {
		return err
	}
	hs := *h
	hs.flags |= flagShm
	hs.encode(pc.hb[:])
	_ = pc.conn.SetWriteDeadline(deadline)
	n, err := pc.conn.Write(pc.hb[:])
	if n == headerSize {
		// Commit only what the receiver will see: an untouched connection
		// (a write that timed out at once) must keep both heads equal.
		r.head = end
	}
	if err != nil {
		return t.writeFailure(pc.rank, err)
	}
	return nil
}

// peerFailure is the error for a peer that died or left, or for this rank
// having closed, and nil while both are alive.
func (t *tcpTransport) peerFailure(peer int) error {
	if why, dead := t.box.deadReason(peer); dead {
		return &waitError{peer: peer, why: why}
	}
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return &waitError{peer: peer, why: "this rank closed its connections"}
	}
	return nil
}
