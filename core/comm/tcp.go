package comm

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// The tcp backend connects every pair of ranks directly (a full mesh: ring
// neighbours for the collectives, any pair for send/recv, and every rank
// learns at once when any other dies because its socket closes). One reader
// goroutine per connection drains frames into the mailbox, so a sender never
// waits for its receiver to post a receive.

const sockBuf = 4 << 20 // socket buffers sized for loopback throughput

type peerConn struct {
	rank int
	conn net.Conn
	wmu  sync.Mutex
	hb   [headerSize]byte
}

type tcpTransport struct {
	rank, size int
	opts       Options
	box        *mailbox
	peers      []*peerConn
	world      *world
	store      *storeClient
	server     *storeServer // rank 0 only
	// shmIn and shmOut are the shared-memory rings with same-host peers
	// (shm.go), indexed by world rank; a nil entry means TCP only.
	shmIn, shmOut []*shmRing
	// hostIDs is every rank's host identity and shmOn whether shared
	// memory is enabled (TINYACC_SHM), both from rendezvous: groups whose
	// ranks share a host run their collectives through a segment.
	hostIDs []string
	shmOn   bool
	// hostOverride is TINYACC_HOST_ID (hostid.go); empty means the host's own.
	hostOverride string

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

func (t *tcpTransport) inbox() *mailbox { return t.box }

// send writes header and payload with one writev; the payload is the
// tensor's own memory, so nothing is copied in user space. Data payloads to
// a same-host peer go through its shared-memory ring instead (sendShm).
func (t *tcpTransport) send(peer int, h *header, payload []byte, deadline time.Time) error {
	pc := t.peers[peer]
	pc.wmu.Lock()
	defer pc.wmu.Unlock()
	if h.kind == kindData && t.shmOut != nil {
		if r := t.shmOut[peer]; r != nil && r.fits(len(payload)) {
			return t.sendShm(pc, r, h, payload, deadline)
		}
	}
	h.encode(pc.hb[:])
	_ = pc.conn.SetWriteDeadline(deadline)
	bufs := net.Buffers{pc.hb[:], payload}
	if _, err := bufs.WriteTo(pc.conn); err != nil {
		return t.writeFailure(peer, err)
	}
	return nil
}

// writeFailure turns an error writing to peer into the error of the waiting
// operation.
func (t *tcpTransport) writeFailure(peer int, err error) error {
	if why, dead := t.box.deadReason(peer); dead {
		return &waitError{peer: peer, why: why}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return &waitError{peer: peer, timeout: true}
	}
	// A connection that breaks under a write is a dead peer, whether
	// the reader has seen its end yet or not.
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return &waitError{peer: peer, why: "this rank closed its connections"}
	}
	// But the reader may still hold what the peer sent before it closed,
	// its abort note above all: marked dead first, the peer would be
	// blamed for a failure it reported. Give the reader a moment to reach
	// the end of the stream.
	t.awaitReader(peer, 200*time.Millisecond)
	t.box.markDead(peer, "connection closed")
	why, _ := t.box.deadReason(peer)
	return &waitError{peer: peer, why: why}
}

// awaitReader waits until the reader of peer's connection marked it dead or
// gone, or d passed.
func (t *tcpTransport) awaitReader(peer int, d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		// Take the channel before looking, so a change in between wakes us.
		t.box.mu.Lock()
		changed := t.box.changed
		t.box.mu.Unlock()
		if _, dead := t.box.deadReason(peer); dead {
			return
		}
		select {
		case <-changed:
		case <-timer.C:
			return
		}
	}
}

func (t *tcpTransport) notify(peer int, n *abortNote, deadline time.Time) {
	p, err := msgpack.Marshal(n)
	if err != nil || len(p) > maxControlPayload {
		return
	}
	h := header{kind: kindAbort, length: uint32(len(p)), group: n.Group, seq: n.Seq}
	_ = t.send(peer, &h, p, deadline)
}

func (t *tcpTransport) probe(peer int, gid uint64, deadline time.Time) (uint64, error) {
	h := header{kind: kindProbe, group: gid}
	if err := t.send(peer, &h, nil, deadline); err != nil {
		return 0, err
	}
	msg, err := t.box.take(boxKey{src: peer, group: gid, ch: chProbe}, deadline, []int{peer})
	if err != nil {
		return 0, err
	}
	return msg.h.seq, nil
}

// readLoop turns the frames of one connection into mailbox entries and
// answers probes; when the connection ends without a bye the peer is dead.
func (t *tcpTransport) readLoop(pc *peerConn) {
	defer t.wg.Done()
	r := bufio.NewReaderSize(pc.conn, 256<<10)
	var hb [headerSize]byte
	for {
		if _, err := io.ReadFull(r, hb[:]); err != nil {
			t.lost(pc, err)
			return
		}
		h, err := decodeHeader(hb[:])
		if err != nil {
			t.lost(pc, err)
			return
		}
		switch h.kind {
		case kindData:
			bp, data := t.box.pool.get(int(h.length))
			if h.flags&flagShm != 0 {
				// The payload is waiting in the shared-memory ring.
				if err := t.readShm(pc.rank, data); err != nil {
					t.lost(pc, err)
					return
				}
			} else if _, err := io.ReadFull(r, data); err != nil {
				t.lost(pc, err)
				return
			}
			t.box.put(boxKey{src: pc.rank, group: h.group, ch: h.ch}, message{h: h, data: data, buf: bp})
		case kindProbe:
			seq := t.world.progress(h.group)
			// Reply from another goroutine: the reader must keep draining
			// even while this connection's writer is busy.
			go func() {
				reply := header{kind: kindProbeReply, group: h.group, seq: seq}
				_ = t.send(pc.rank, &reply, nil, time.Now().Add(probeTimeout))
			}()
		case kindProbeReply:
			t.box.put(boxKey{src: pc.rank, group: h.group, ch: chProbe}, message{h: h})
		case kindAbort:
			p := make([]byte, h.length)
			if _, err := io.ReadFull(r, p); err != nil {
				t.lost(pc, err)
				return
			}
			var n abortNote
			if err := decodeControl(p, &n); err != nil {
				t.lost(pc, err)
				return
			}
			t.box.addNote(pc.rank, &n)
		case kindBye:
			t.box.markGone(pc.rank)
			return
		default:
			t.lost(pc, fmt.Errorf("%w: unexpected kind %d on a peer connection", errFrame, h.kind))
			return
		}
	}
}

func (t *tcpTransport) lost(pc *peerConn, err error) {
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return
	}
	// EOF, reset and the like all mean the process on the other end is
	// gone; only a malformed frame deserves its own message.
	why := "connection closed"
	if errors.Is(err, errFrame) {
		why = "sent a malformed frame: " + err.Error()
	}
	t.box.markDead(pc.rank, why)
	pc.conn.Close()
}

func (t *tcpTransport) close(orderly bool) error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.mu.Unlock()
	for _, pc := range t.peers {
		if pc == nil {
			continue
		}
		if orderly {
			bye := header{kind: kindBye}
			_ = t.send(pc.rank, &bye, nil, time.Now().Add(time.Second))
		}
		pc.conn.Close()
	}
	if orderly && t.server != nil && t.store != nil {
		// Rank 0 hosts the store: let every rank read the end of its
		// rendezvous first (bounded; a crashed rank must not hold us).
		_ = t.store.waitGE(joinedKey, int64(t.size), time.Now().Add(min(t.opts.Timeout, 10*time.Second)))
	}
	if t.store != nil {
		t.store.close()
	}
	if t.server != nil {
		t.server.close()
	}
	t.wg.Wait()
	t.releaseShm()
	return nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func tuneConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
		_ = tc.SetReadBuffer(sockBuf)
		_ = tc.SetWriteBuffer(sockBuf)
	}
}
