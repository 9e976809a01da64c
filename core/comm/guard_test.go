package comm

import (
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// idle opens n connections to addr that never send a byte, and returns
// a function that closes them.
func idle(t *testing.T, addr string, n int) func() {
	t.Helper()
	var conns []net.Conn
	for range n {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		conns = append(conns, c)
	}
	return func() {
		for _, c := range conns {
			c.Close()
		}
	}
}

// A hundred connections that say nothing, opened before a rank joins: the
// rank still joins the store within a deadline (5 s) shorter than the hello
// timeout (10 s) the strangers would otherwise each hold a slot for.
func TestIdleConnectionsDoNotDelayTheStore(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	log := &syncBuffer{}
	srv := startStore(ln, testToken, 2, log)
	closeIdle := idle(t, ln.Addr().String(), 100)
	sc, err := dialStore(ln.Addr().String(), testToken, 1, 2, time.Now().Add(5*time.Second))
	require.NoError(t, err)
	deadline := time.Now().Add(5 * time.Second)
	require.NoError(t, sc.set("k", []byte("v"), deadline))
	sc.close()
	srv.close()
	closeIdle()
	assert.Regexp(t, `^comm: store refused connection from 127\.0\.0\.1:\d+: no hello before it was dropped \(it sent nothing\)\n`, log.String())
}

// The same on a rank's peer listener, which used to read one hello at a
// time.
func TestIdleConnectionsDoNotDelayPeers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	env := EnvInfo{Rank: 0, Size: 2, Token: testToken}
	peers := make([]*peerConn, 2)
	done := make(chan error, 1)
	deadline := time.Now().Add(5 * time.Second)
	defer idle(t, ln.Addr().String(), 100)()
	go func() { done <- acceptPeers(ln, env, &syncBuffer{}, peers, deadline) }()
	good, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer good.Close()
	require.NoError(t, clientHello(good, good, hello{V: protocolVersion, Token: testToken, Rank: 1, World: 2, Role: "peer"}, deadline))
	require.NoError(t, <-done)
	require.NotNil(t, peers[1])
	peers[1].conn.Close()
}

// A flood of refused connections writes the first in full and then at most
// one summary line a second, which together count every refusal.
func TestRefusalsAreSummarized(t *testing.T) {
	log := &syncBuffer{}
	l := newRefusalLog(log, "store")
	from := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 4000}
	const n = 5000
	start := time.Now()
	for i := range n {
		from.Port = 4000 + i%1000
		l.refused(from, "wrong or missing job token (TINYACC_JOB_TOKEN)")
	}
	l.close()
	elapsed := time.Since(start)
	lines := strings.Split(strings.TrimSuffix(log.String(), "\n"), "\n")
	assert.Equal(t, "comm: store refused connection from 127.0.0.1:4000: wrong or missing job token (TINYACC_JOB_TOKEN)", lines[0])
	re := regexp.MustCompile(`^comm: store refused (\d+) more connections? within a second; the last from 127\.0\.0\.1:\d+: wrong or missing job token \(TINYACC_JOB_TOKEN\)$`)
	counted := 1
	for _, line := range lines[1:] {
		m := re.FindStringSubmatch(line)
		require.NotNil(t, m, line)
		k, _ := strconv.Atoi(m[1])
		counted += k
	}
	assert.Equal(t, n, counted, "every refusal is counted")
	assert.LessOrEqual(t, len(lines), 2+int(elapsed/time.Second), "one summary line a second at most:\n%s", log.String())
	l.refused(from, "late")
	assert.Len(t, strings.Split(strings.TrimSuffix(log.String(), "\n"), "\n"), len(lines), "nothing is logged after close")
}

// A job without TINYACC_JOB_TOKEN runs, and rank 0 says once what that
// means and how to set one.
func TestNoTokenWarning(t *testing.T) {
	port := freeLoopbackPort(t)
	log := &syncBuffer{}
	env := EnvInfo{Rank: 0, Size: 1, MasterAddr: "127.0.0.1", MasterPort: port, Source: "torchrun"}
	g, err := newTCP(env, Options{Timeout: 10 * time.Second, Log: log}, nil)
	require.NoError(t, err)
	require.NoError(t, g.Close())
	assert.Equal(t, fmt.Sprintf("comm: warning: TINYACC_JOB_TOKEN is not set, so any process that reaches 127.0.0.1:%d can join this job as a rank; "+
		"tinyacc launch and train --nproc give their ranks one, and ranks under Open MPI's mpirun derive one from it; "+
		"otherwise export the same secret to every rank, e.g. TINYACC_JOB_TOKEN=$(openssl rand -hex 32)\n", port), log.String())

	log = &syncBuffer{}
	env.Token = testToken
	g, err = newTCP(env, Options{Timeout: 10 * time.Second, Log: log}, nil)
	require.NoError(t, err)
	require.NoError(t, g.Close())
	assert.Empty(t, log.String())
}

// Under mpirun every rank derives the same token from mpirun's per-job key;
// another job's key gives another token; TINYACC_JOB_TOKEN wins.
func TestTokenFromMpirun(t *testing.T) {
	rank := func(r int, extra ...string) EnvInfo {
		env := append([]string{"OMPI_COMM_WORLD_RANK=" + strconv.Itoa(r), "OMPI_COMM_WORLD_SIZE=2"}, extra...)
		info, err := ReadEnv(env)
		require.NoError(t, err)
		return info
	}
	a0 := rank(0, "OMPI_MCA_orte_precondition_transports=d14bef725a2ec04f-582aba691b8fac88")
	a1 := rank(1, "OMPI_MCA_orte_precondition_transports=d14bef725a2ec04f-582aba691b8fac88")
	b := rank(0, "OMPI_MCA_orte_precondition_transports=0000000000000001-582aba691b8fac88")
	assert.Regexp(t, `^openmpi-[0-9a-f]{64}$`, a0.Token)
	assert.Equal(t, a0.Token, a1.Token)
	assert.NotEqual(t, a0.Token, b.Token)
	assert.NotContains(t, a0.Token, "d14bef725a2ec04f", "the key itself never travels")
	assert.Equal(t, "mine", rank(0, "OMPI_MCA_orte_precondition_transports=d14bef725a2ec04f-582aba691b8fac88", "TINYACC_JOB_TOKEN=mine").Token)
	assert.Empty(t, rank(0).Token)
}

// A rank whose connection the store dropped before answering (as the
// helloGate drops the oldest silent connection in a crowd) connects again
// instead of failing; a refusal still fails at once.
func TestStoreDialRetriesADroppedHello(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dropped := make(chan *storeServer, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Close() // no answer at all
		}
		dropped <- startStore(ln, testToken, 2, &syncBuffer{})
	}()
	sc, err := dialStore(ln.Addr().String(), testToken, 1, 2, time.Now().Add(5*time.Second))
	require.NoError(t, err)
	sc.close()
	srv := <-dropped
	defer srv.close()
	_, err = dialStore(ln.Addr().String(), "wrong", 1, 2, time.Now().Add(5*time.Second))
	assert.EqualError(t, err, "comm: store at "+ln.Addr().String()+": connection refused by the remote side: wrong or missing job token (TINYACC_JOB_TOKEN)")
}
