package comm

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// What the store and the peer listeners do about connections that are not
// ranks of this job: strangers that send nothing, a wrong token, garbage.
// Neither may delay the ranks, grow memory, or flood the log.

// helloGate holds the connections that have not proven the job token yet,
// at most limit of them. A new connection beyond the limit closes the
// oldest one instead of waiting for a free slot: a rank sends its hello the
// moment it connects and passes in microseconds, while a stranger that
// sends nothing would otherwise hold its slot for the whole hello timeout,
// and a hundred such would keep the ranks out for rounds of it.
type helloGate struct {
	limit int

	mu      sync.Mutex
	waiting []net.Conn // oldest first
}

func newHelloGate(limit int) *helloGate { return &helloGate{limit: limit} }

// admit adds conn, closing the oldest waiting connection when full.
func (g *helloGate) admit(conn net.Conn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.waiting) >= g.limit {
		g.waiting[0].Close()
		g.waiting = append(g.waiting[:0], g.waiting[1:]...)
	}
	g.waiting = append(g.waiting, conn)
}

// passed removes conn: it has said its hello (or failed to).
func (g *helloGate) passed(conn net.Conn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, c := range g.waiting {
		if c == conn {
			g.waiting = append(g.waiting[:i], g.waiting[i+1:]...)
			return
		}
	}
}

// closeAll closes every waiting connection.
func (g *helloGate) closeAll() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range g.waiting {
		c.Close()
	}
	g.waiting = nil
}

// refusalLog writes refused connections to a log: the first of a quiet
// spell in full at once, then at most one line a second that counts the
// ones since and repeats the last. A flood of thousands of strangers
// writes a few lines, not one each.
type refusalLog struct {
	w    io.Writer
	what string // who refuses: "store", "rank 3"

	mu     sync.Mutex
	quiet  time.Time // a refusal after this is written at once
	count  int       // refusals not written yet
	last   string
	timer  *time.Timer
	closed bool
}

func newRefusalLog(w io.Writer, what string) *refusalLog {
	return &refusalLog{w: w, what: what}
}

// refused logs one refused connection from remote.
func (l *refusalLog) refused(remote net.Addr, why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	now := time.Now()
	if l.count == 0 && now.After(l.quiet) {
		fmt.Fprintf(l.w, "comm: %s refused connection from %s: %s\n", l.what, remote, why)
		l.quiet = now.Add(time.Second)
		return
	}
	l.count++
	l.last = fmt.Sprintf("%s: %s", remote, why)
	if l.timer == nil {
		l.timer = time.AfterFunc(time.Until(l.quiet), l.flush)
	}
}

// flush writes the count of the second that ended.
func (l *refusalLog) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.timer = nil
	if l.count > 0 {
		l.writeCountLocked()
		l.quiet = time.Now().Add(time.Second)
	}
}

func (l *refusalLog) writeCountLocked() {
	if l.count == 0 {
		return
	}
	s := "s"
	if l.count == 1 {
		s = ""
	}
	fmt.Fprintf(l.w, "comm: %s refused %d more connection%s within a second; the last from %s\n", l.what, l.count, s, l.last)
	l.count = 0
}

// close writes what is still counted; nothing is logged after it.
func (l *refusalLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
	l.writeCountLocked()
	l.closed = true
}

// badHello says why a connection's hello could not be read. One this side
// closed said nothing while newer ones waited (helloGate), or was still
// silent when the listener closed.
func badHello(err error) string {
	if errors.Is(err, net.ErrClosed) {
		return "no hello before it was dropped (it sent nothing)"
	}
	return "bad hello: " + err.Error()
}

// refuse answers a failed hello, logs it, and closes the connection.
func refuse(conn net.Conn, log *refusalLog, err error) {
	log.refused(conn.RemoteAddr(), err.Error())
	_ = conn.SetWriteDeadline(time.Now().Add(time.Second))
	_ = writeControl(conn, kindHelloAck, helloAck{V: protocolVersion, Err: err.Error()})
	conn.Close()
}
