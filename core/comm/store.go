package comm

import (
	"bufio"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// The store is a small key-value service hosted by rank 0 at
// MASTER_ADDR:MASTER_PORT. Ranks use it to rendezvous: each publishes the
// address of its peer listener and reads the others'. Requests are msgpack
// frames; a get can wait for a key that another rank has not set yet.

// helloTimeout bounds how long a new connection may take to identify itself,
// so a silent client cannot hold a server goroutine.
const helloTimeout = 10 * time.Second

// maxPendingHellos bounds the connections the store holds before they have
// proven the job token; past it, a new connection closes the oldest one
// (helloGate), so strangers neither grow this process's memory nor keep
// the ranks waiting.
const maxPendingHellos = 64

// checkHello verifies a hello against this job. The token is compared in
// constant time so its content cannot be guessed from response timing.
func checkHello(h hello, token, role string, world int) error {
	if h.V != protocolVersion {
		return fmt.Errorf("protocol version %d, this rank speaks %d (mixed tinyacc builds?)", h.V, protocolVersion)
	}
	if subtle.ConstantTimeCompare([]byte(h.Token), []byte(token)) != 1 {
		return errors.New("wrong or missing job token (TINYACC_JOB_TOKEN)")
	}
	if h.Role != role {
		return fmt.Errorf("connection for %q reached the %s listener", h.Role, role)
	}
	if h.World != world {
		return fmt.Errorf("world size %d, this job has %d", h.World, world)
	}
	if h.Rank < 0 || h.Rank >= world {
		return fmt.Errorf("rank %d outside world of %d", h.Rank, world)
	}
	return nil
}

type storeServer struct {
	ln       net.Listener
	token    string
	world    int
	refusals *refusalLog
	log      io.Writer

	mu      sync.Mutex
	data    map[string][]byte
	changed chan struct{}
	conns   map[net.Conn]struct{}
	closed  bool
	wg      sync.WaitGroup
	hellos  *helloGate // connections still in their hello

	// watchRanks makes a rank whose connection ends before it said
	// goodbye (byeKey) known under deadKey: the mpi backend's side
	// channel learns this way that a rank's process ended.
	watchRanks bool
}

// The keys of the side channel that watchRanks keeps.
const (
	deadKey   = "tinyacc/dead" // the first rank whose connection ended without a goodbye
	byeCount  = "tinyacc/byes" // how many ranks said goodbye
	byePrefix = "tinyacc/bye/"
)

func startStore(ln net.Listener, token string, world int, log io.Writer) *storeServer {
	return startStoreWatching(ln, token, world, log, false)
}

// startStoreWatching is startStore; with watchRanks, the store notes the
// first rank whose connection ends without a goodbye (rankLeft).
func startStoreWatching(ln net.Listener, token string, world int, log io.Writer, watchRanks bool) *storeServer {
	s := &storeServer{ln: ln, token: token, world: world, log: log, refusals: newRefusalLog(log, "store"),
		data: map[string][]byte{}, changed: make(chan struct{}), conns: map[net.Conn]struct{}{},
		hellos: newHelloGate(maxPendingHellos), watchRanks: watchRanks}
	s.wg.Add(1)
	go s.serve()
	return s
}

func (s *storeServer) serve() {
	defer s.wg.Done()
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			conn.Close()
			return
		}
		s.conns[conn] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		s.hellos.admit(conn)
		go s.handle(conn)
	}
}

func (s *storeServer) close() {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
	s.ln.Close()
	s.wg.Wait()
	s.refusals.close()
}

func (s *storeServer) handle(conn net.Conn) {
	defer func() {
		s.hellos.passed(conn)
		conn.Close()
		s.mu.Lock()
		delete(s.conns, conn)
		s.mu.Unlock()
		s.wg.Done()
	}()
	r := bufio.NewReader(conn)
	_ = conn.SetDeadline(time.Now().Add(helloTimeout))
	var h hello
	if err := readControl(r, kindHello, &h); err != nil {
		s.refusals.refused(conn.RemoteAddr(), badHello(err))
		return
	}
	s.hellos.passed(conn)
	if err := checkHello(h, s.token, "store", s.world); err != nil {
		refuse(conn, s.refusals, err)
		return
	}
	if err := writeControl(conn, kindHelloAck, helloAck{V: protocolVersion, OK: true}); err != nil {
		return
	}
	_ = conn.SetDeadline(time.Time{})
	for {
		var req storeReq
		if err := readControl(r, kindStoreReq, &req); err != nil {
			s.rankLeft(h.Rank)
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !s.watchRanks {
				fmt.Fprintf(s.log, "comm: store dropped rank %d (%s): %v\n", h.Rank, conn.RemoteAddr(), err)
			}
			return
		}
		if err := writeControl(conn, kindStoreResp, s.apply(req)); err != nil {
			return
		}
	}
}

func (s *storeServer) apply(req storeReq) storeResp {
	if req.V != protocolVersion {
		return storeResp{V: protocolVersion, Err: fmt.Sprintf("store protocol version %d, server speaks %d", req.V, protocolVersion)}
	}
	timeout := time.Duration(req.TimeoutMs) * time.Millisecond
	switch req.Op {
	case "set":
		s.mu.Lock()
		s.data[req.Key] = req.Value
		s.notifyLocked()
		s.mu.Unlock()
		return storeResp{V: protocolVersion, OK: true}
	case "add":
		s.mu.Lock()
		n, _ := strconv.ParseInt(string(s.data[req.Key]), 10, 64)
		n += req.N
		s.data[req.Key] = []byte(strconv.FormatInt(n, 10))
		s.notifyLocked()
		s.mu.Unlock()
		return storeResp{V: protocolVersion, OK: true, N: n}
	case "get", "wait_ge":
		deadline := time.Now().Add(timeout)
		for {
			s.mu.Lock()
			v, ok := s.data[req.Key]
			if ok && req.Op == "wait_ge" {
				n, _ := strconv.ParseInt(string(v), 10, 64)
				ok = n >= req.N
			}
			changed, closed := s.changed, s.closed
			s.mu.Unlock()
			if ok {
				return storeResp{V: protocolVersion, OK: true, Value: v}
			}
			if closed {
				return storeResp{V: protocolVersion, Err: "store is shutting down"}
			}
			d := time.Until(deadline)
			if d <= 0 {
				return storeResp{V: protocolVersion, Err: fmt.Sprintf("timed out after %s waiting for key %q", timeout, req.Key)}
			}
			t := time.NewTimer(d)
			select {
			case <-changed:
			case <-t.C:
			}
			t.Stop()
		}
	}
	return storeResp{V: protocolVersion, Err: fmt.Sprintf("unknown store op %q", req.Op)}
}

// rankLeft records, when ranks are watched, that rank's connection ended:
// without its goodbye, its process ended (or cut its connection), and the
// first such rank is named under deadKey.
func (s *storeServer) rankLeft(rank int) {
	if !s.watchRanks {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if _, said := s.data[byePrefix+strconv.Itoa(rank)]; said {
		return
	}
	if _, ok := s.data[deadKey]; !ok {
		s.data[deadKey] = []byte(strconv.Itoa(rank))
		s.notifyLocked()
	}
}

// missingKeys lists the ranks r < world whose key(r) is not set yet.
func (s *storeServer) missingKeys(key func(int) string, world int) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	missing := []int{}
	for r := range world {
		if _, ok := s.data[key(r)]; !ok {
			missing = append(missing, r)
		}
	}
	return missing
}

func (s *storeServer) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// storeClient is one rank's connection to the store.
type storeClient struct {
	mu   sync.Mutex
	conn net.Conn
	r    *bufio.Reader
}

// dialStore connects to the store, retrying until deadline because rank 0
// may not be listening yet when the other ranks start.
func dialStore(addr, token string, rank, world int, deadline time.Time) (*storeClient, error) {
	var lastErr error
	for backoff := 20 * time.Millisecond; time.Now().Before(deadline); backoff = min(backoff*2, time.Second) {
		d := net.Dialer{Deadline: deadline}
		conn, err := d.Dial("tcp", addr)
		if err != nil {
			lastErr = err
			time.Sleep(min(backoff, time.Until(deadline)))
			continue
		}
		c := &storeClient{conn: conn, r: bufio.NewReader(conn)}
		if err := clientHello(conn, c.r, hello{V: protocolVersion, Token: token, Rank: rank, World: world, Role: "store"}, deadline); err != nil {
			conn.Close()
			var refused *refusedError
			if errors.As(err, &refused) || !time.Now().Before(deadline) {
				return nil, fmt.Errorf("comm: store at %s: %w", addr, err)
			}
			// Closed before any answer: the store dropped this
			// connection among a crowd of silent ones (helloGate).
			lastErr = err
			continue
		}
		return c, nil
	}
	return nil, fmt.Errorf("comm: cannot reach the store at %s (MASTER_ADDR:MASTER_PORT) before the deadline: %v; is rank 0 running?", addr, lastErr)
}

// clientHello sends h and waits for the acknowledgement.
func clientHello(conn net.Conn, r io.Reader, h hello, deadline time.Time) error {
	_ = conn.SetDeadline(deadline)
	defer conn.SetDeadline(time.Time{})
	if err := writeControl(conn, kindHello, h); err != nil {
		return err
	}
	var ack helloAck
	if err := readControl(r, kindHelloAck, &ack); err != nil {
		return fmt.Errorf("no hello acknowledgement: %w", err)
	}
	if !ack.OK {
		return &refusedError{ack.Err}
	}
	return nil
}

// refusedError is a hello the other side answered with a refusal: trying
// again cannot help.
type refusedError struct{ why string }

func (e *refusedError) Error() string { return "connection refused by the remote side: " + e.why }

func (c *storeClient) do(req storeReq, deadline time.Time) (storeResp, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	req.V = protocolVersion
	_ = c.conn.SetDeadline(deadline.Add(time.Second))
	defer c.conn.SetDeadline(time.Time{})
	if err := writeControl(c.conn, kindStoreReq, req); err != nil {
		return storeResp{}, fmt.Errorf("comm: store %s %q: %w", req.Op, req.Key, err)
	}
	var resp storeResp
	if err := readControl(c.r, kindStoreResp, &resp); err != nil {
		return storeResp{}, fmt.Errorf("comm: store %s %q: %w", req.Op, req.Key, err)
	}
	if !resp.OK {
		return resp, fmt.Errorf("comm: store %s %q: %s", req.Op, req.Key, resp.Err)
	}
	return resp, nil
}

func (c *storeClient) set(key string, v []byte, deadline time.Time) error {
	_, err := c.do(storeReq{Op: "set", Key: key, Value: v}, deadline)
	return err
}

func (c *storeClient) get(key string, deadline time.Time) ([]byte, error) {
	resp, err := c.do(storeReq{Op: "get", Key: key, TimeoutMs: time.Until(deadline).Milliseconds()}, deadline)
	return resp.Value, err
}

func (c *storeClient) add(key string, n int64, deadline time.Time) (int64, error) {
	resp, err := c.do(storeReq{Op: "add", Key: key, N: n}, deadline)
	return resp.N, err
}

func (c *storeClient) waitGE(key string, n int64, deadline time.Time) error {
	_, err := c.do(storeReq{Op: "wait_ge", Key: key, N: n, TimeoutMs: time.Until(deadline).Milliseconds()}, deadline)
	return err
}

func (c *storeClient) close() error { return c.conn.Close() }
