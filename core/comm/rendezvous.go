package comm

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// Rendezvous: rank 0 hosts the store; every rank publishes the address of
// its peer listener there, then lower ranks accept and higher ranks dial so
// each pair connects exactly once, every connection proving the job token.

func newTCPFromEnv(env EnvInfo, opts Options) (Group, error) {
	if err := spanCheck(env); err != nil {
		return nil, err
	}
	return newTCP(env, opts, nil)
}

// newTCP rendezvouses through the store and builds the mesh. storeLn, when
// not nil, is rank 0's already-open store listener (tests pick free ports
// this way).
func newTCP(env EnvInfo, opts Options, storeLn net.Listener) (Group, error) {
	opts = opts.withDefaults()
	if !hostLittleEndian() {
		return nil, errors.New("comm: the tcp backend sends tensors in host byte order and needs a little-endian host")
	}
	if env.Token == "" && env.Rank == 0 {
		warnNoToken(opts.Log, env)
	}
	deadline := time.Now().Add(opts.Timeout)
	t := &tcpTransport{rank: env.Rank, size: env.Size, opts: opts, box: newMailbox(opts.ChunkBytes),
		peers: make([]*peerConn, env.Size), hostOverride: env.HostID}
	fail := func(err error) (Group, error) {
		t.closeAll()
		return nil, err
	}
	storeAddr := net.JoinHostPort(env.MasterAddr, strconv.Itoa(env.MasterPort))
	note := startWaitNote(opts.Log, opts.Timeout, waitNoteFirst, waitNoteEvery)
	defer note.end()
	who := fmt.Sprintf("rank %d (world size %d)", env.Rank, env.Size)
	where := fmt.Sprintf("%s port %d (MASTER_ADDR, MASTER_PORT)", env.MasterAddr, env.MasterPort)
	note.set(func() string {
		return fmt.Sprintf("%s is waiting for rank 0's store at %s; nothing answers there yet: is rank 0 running?", who, where)
	})
	if env.Rank == 0 {
		if storeLn == nil {
			bind := storeBindHost(env.MasterAddr)
			ln, err := net.Listen("tcp", net.JoinHostPort(bind, strconv.Itoa(env.MasterPort)))
			if err != nil {
				return nil, fmt.Errorf("comm: rank 0 cannot host the store on %s port %d: %w (MASTER_ADDR must be an address of rank 0's host; or choose another MASTER_PORT)", env.MasterAddr, env.MasterPort, err)
			}
			storeLn = ln
		}
		t.server = startStore(storeLn, env.Token, env.Size, opts.Log)
	}
	store, err := dialStore(storeAddr, env.Token, env.Rank, env.Size, deadline)
	if err != nil {
		return fail(err)
	}
	t.store = store
	note.set(func() string {
		if t.server == nil {
			return fmt.Sprintf("%s is waiting for the other ranks to join at %s", who, where)
		}
		if missing := t.server.missingKeys(peerKey, env.Size); len(missing) > 0 {
			return fmt.Sprintf("%s is waiting for ranks %v to join at %s", who, missing, where)
		}
		return fmt.Sprintf("%s is waiting for the %d ranks to connect to each other", who, env.Size)
	})

	host := peerHost(store.conn, env.MasterAddr, env.Rank, opts.Log)
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return fail(fmt.Errorf("comm: rank %d cannot open its peer listener on %s: %w", env.Rank, host, err))
	}
	defer ln.Close()
	adv := net.JoinHostPort(host, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	if err := store.set(peerKey(env.Rank), []byte(adv), deadline); err != nil {
		return fail(err)
	}

	// Lower ranks accept, higher ranks dial: each pair connects once.
	var wg sync.WaitGroup
	var acceptErr, dialErr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		acceptErr = acceptPeers(ln, env, opts.Log, t.peers, deadline)
	}()
	go func() {
		defer wg.Done()
		dialErr = t.dialPeers(env, deadline)
	}()
	wg.Wait()
	if err := errors.Join(acceptErr, dialErr); err != nil {
		return fail(err)
	}
	if err := t.setupShm(deadline); err != nil {
		return fail(err)
	}
	w, g := newWorld(t, env.Rank, env.Size, opts)
	t.world = w
	for _, pc := range t.peers {
		if pc != nil {
			t.wg.Add(1)
			go t.readLoop(pc)
		}
	}
	// Nobody may close the store (rank 0 leaving early) before every rank
	// has finished its rendezvous.
	if _, err := store.add("tinyacc/ready", 1, deadline); err != nil {
		return fail(err)
	}
	if err := store.waitGE("tinyacc/ready", int64(env.Size), deadline); err != nil {
		arrived, _ := store.add("tinyacc/ready", 0, time.Now().Add(time.Second))
		return fail(fmt.Errorf("comm: rendezvous of %d ranks did not complete: %d of %d arrived: %w", env.Size, arrived, env.Size, err))
	}
	// Every sender has mapped its ring by now: no file needs a name.
	t.unlinkShm()
	// Tell rank 0 this rank has its answer, so an orderly close of the
	// store (rank 0 finishing first) waits for it instead of cutting it off.
	// The rendezvous is complete already: rank 0 may see the count reach
	// the world size and close the store before this reply is written, so
	// a failed reply is no failure.
	_, _ = store.add(joinedKey, 1, deadline)
	return g, nil
}

// joinedKey counts the ranks that completed their rendezvous.
const joinedKey = "tinyacc/joined"

func peerKey(rank int) string { return "tinyacc/peer/" + strconv.Itoa(rank) }

func (t *tcpTransport) closeAll() {
	for _, pc := range t.peers {
		if pc != nil {
			pc.conn.Close()
		}
	}
	t.wg.Wait() // readers still use the rings until their connection ends
	t.releaseShm()
	if t.store != nil {
		t.store.close()
	}
	if t.server != nil {
		t.server.close()
	}
}

func (t *tcpTransport) dialPeers(env EnvInfo, deadline time.Time) error {
	for j := 0; j < env.Rank; j++ {
		addr, err := t.store.get(peerKey(j), deadline)
		if err != nil {
			return fmt.Errorf("comm: rank %d waiting for the address of rank %d: %w", env.Rank, j, err)
		}
		d := net.Dialer{Deadline: deadline}
		conn, err := d.Dial("tcp", string(addr))
		if err != nil {
			return fmt.Errorf("comm: rank %d cannot connect to rank %d at %s: %w", env.Rank, j, addr, err)
		}
		tuneConn(conn)
		h := hello{V: protocolVersion, Token: env.Token, Rank: env.Rank, World: env.Size, Role: "peer"}
		if err := clientHello(conn, conn, h, deadline); err != nil {
			conn.Close()
			return fmt.Errorf("comm: rank %d connecting to rank %d at %s: %w", env.Rank, j, addr, err)
		}
		t.peers[j] = &peerConn{rank: j, conn: conn}
	}
	return nil
}

// acceptPeers accepts one connection from each rank above env.Rank. A
// connection that fails the hello (wrong token, wrong job) is refused and
// logged, and does not count. Hellos are read concurrently, behind a
// helloGate: a stranger that connects and says nothing holds up no rank.
func acceptPeers(ln net.Listener, env EnvInfo, log io.Writer, peers []*peerConn, deadline time.Time) error {
	need := env.Size - 1 - env.Rank
	if need == 0 {
		return nil
	}
	refusals := newRefusalLog(log, fmt.Sprintf("rank %d", env.Rank))
	defer refusals.close()
	gate := newHelloGate(maxPendingHellos)
	type arrival struct {
		conn net.Conn
		h    hello
	}
	arrivals := make(chan arrival)
	acceptErr := make(chan error, 1)
	done, acceptDone := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup // the hellos in progress
	if tl, ok := ln.(*net.TCPListener); ok {
		_ = tl.SetDeadline(deadline)
	}
	go func() {
		defer close(acceptDone)
		for {
			conn, err := ln.Accept()
			if err != nil {
				acceptErr <- err
				return
			}
			gate.admit(conn)
			wg.Add(1)
			go func() {
				defer wg.Done()
				hd := time.Now().Add(helloTimeout)
				if deadline.Before(hd) {
					hd = deadline
				}
				_ = conn.SetDeadline(hd)
				var h hello
				err := readControl(conn, kindHello, &h)
				gate.passed(conn)
				if err == nil {
					err = checkHello(h, env.Token, "peer", env.Size)
					if err != nil {
						refuse(conn, refusals, err)
						return
					}
				} else {
					refusals.refused(conn.RemoteAddr(), badHello(err))
					conn.Close()
					return
				}
				select {
				case arrivals <- arrival{conn, h}:
				case <-done:
					conn.Close()
				}
			}()
		}
	}()
	defer func() {
		// Stop accepting, then end the hellos still in progress.
		close(done)
		if tl, ok := ln.(*net.TCPListener); ok {
			_ = tl.SetDeadline(time.Now())
		} else {
			ln.Close()
		}
		<-acceptDone
		gate.closeAll()
		wg.Wait()
		if tl, ok := ln.(*net.TCPListener); ok {
			_ = tl.SetDeadline(time.Time{})
		}
	}()
	for need > 0 {
		select {
		case a := <-arrivals:
			if a.h.Rank <= env.Rank || peers[a.h.Rank] != nil {
				refuse(a.conn, refusals, fmt.Errorf("unexpected connection from rank %d", a.h.Rank))
				continue
			}
			if err := writeControl(a.conn, kindHelloAck, helloAck{V: protocolVersion, OK: true}); err != nil {
				a.conn.Close()
				continue
			}
			_ = a.conn.SetDeadline(time.Time{})
			tuneConn(a.conn)
			peers[a.h.Rank] = &peerConn{rank: a.h.Rank, conn: a.conn}
			need--
		case err := <-acceptErr:
			var missing []int
			for r := env.Rank + 1; r < env.Size; r++ {
				if peers[r] == nil {
					missing = append(missing, r)
				}
			}
			return fmt.Errorf("comm: rank %d: ranks %v (%d of the %d it waits for) did not connect before the deadline: %w",
				env.Rank, missing, len(missing), env.Size-1-env.Rank, err)
		}
	}
	return nil
}
