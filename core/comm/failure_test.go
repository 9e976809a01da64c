package comm

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// rankErrors splits a RunLocal/runTCP error into one line per rank.
func rankErrors(err error) map[int]string {
	out := map[int]string{}
	if err == nil {
		return out
	}
	var joined interface{ Unwrap() []error }
	errs := []error{err}
	if errors.As(err, &joined) {
		errs = joined.Unwrap()
	}
	for _, e := range errs {
		var r int
		if _, serr := fmt.Sscanf(e.Error(), "rank %d:", &r); serr == nil {
			out[r] = e.Error()
		}
	}
	return out
}

// A rank that stops in the middle of an all-reduce (its connections close as
// if its process died): every other rank fails fast, naming the operation,
// group, sequence number and the missing rank.
func TestRankStoppingMidAllReduce(t *testing.T) {
	for name, run := range backendRunners {
		t.Run(name, func(t *testing.T) {
			const n = 4
			err := run(t, n, Options{Timeout: 2 * time.Second}, func(g Group) error {
				if err := g.Barrier(); err != nil { // seq 1
					return err
				}
				x := filled(tensor.Float32, g.Rank(), 1<<20, 0)
				if g.Rank() == 3 {
					h := g.AllReduceAsync(x, Sum) // seq 2, then die
					_ = g.(*group).abort()
					_ = h.Wait()
					return errors.New("stopped on purpose")
				}
				return g.AllReduce(x, Sum)
			})
			errs := rankErrors(err)
			require.Len(t, errs, n, "every rank fails: %v", err)
			why := "connection closed"
			if name == "local" {
				why = "stopped (closed its connections)"
			}
			// Rank 3 started its all-reduce before closing, so it may have
			// arrived and told the others that it gave up, or not; a rank
			// may also hear first from another that gave up because of
			// rank 3, whose reason it then quotes: either way each names
			// the operation, group, sequence and rank 3.
			for r := 0; r < 3; r++ {
				assert.Regexp(t, fmt.Sprintf(`^rank %d: comm: all_reduce on group "world" seq 2 failed after [0-9.]+(µs|ms|s): (rank [0-2] gave up: comm: all_reduce on group "world" seq 2 failed after [0-9.]+(µs|ms|s): )*(ranks \[3\] did not arrive \(rank 3: %s\)|rank 3 gave up: comm: all_reduce on group "world" seq 2 .*)$`, r, regexpQuote(why)), errs[r])
			}
		})
	}
}

func regexpQuote(s string) string {
	r := strings.NewReplacer("(", `\(`, ")", `\)`, ".", `\.`)
	return r.Replace(s)
}

// A rank that is alive but never calls the collective: the others time out
// and learn from it (by probing) that it never started that sequence number.
func TestRankNotArrivingTimesOut(t *testing.T) {
	for name, run := range backendRunners {
		t.Run(name, func(t *testing.T) {
			const n = 3
			others := make(chan struct{}, n)
			err := run(t, n, Options{Timeout: 300 * time.Millisecond}, func(g Group) error {
				if err := g.Barrier(); err != nil {
					return err
				}
				if g.Rank() == 1 {
					// Stay connected until the others have given up.
					for range n - 1 {
						<-others
					}
					return nil
				}
				err := g.AllReduce(filled(tensor.Float32, g.Rank(), 50000, 0), Sum)
				others <- struct{}{}
				return err
			})
			errs := rankErrors(err)
			require.Len(t, errs, 2, "%v", err)
			for _, r := range []int{0, 2} {
				assert.Regexp(t, fmt.Sprintf(`^rank %d: comm: all_reduce on group "world" seq 2 failed after \d+ms: ranks \[1\] did not arrive \(rank 1: last started seq 1\)$`, r), errs[r])
			}
		})
	}
}

// After a failure the group refuses further work instead of mixing stale
// data into the next collective.
func TestGroupUnusableAfterFailure(t *testing.T) {
	err := RunLocal(2, Options{Timeout: 100 * time.Millisecond}, func(g Group) error {
		if g.Rank() == 1 {
			return nil // leaves in order without calling anything
		}
		err := g.AllReduce(filled(tensor.Float32, 0, 4, 0), Sum)
		if err == nil {
			return errors.New("all_reduce without a peer succeeded")
		}
		want := `comm: all_reduce on group "world" seq 1 failed after`
		if !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "ranks [1] did not arrive (rank 1: left the job (closed its connections))") {
			return fmt.Errorf("unexpected first error: %v", err)
		}
		err2 := g.Barrier()
		if err2 == nil || !strings.Contains(err2.Error(), `comm: barrier on group "world" seq 2 not run: the group failed earlier`) {
			return fmt.Errorf("unexpected second error: %v", err2)
		}
		return nil
	})
	require.NoError(t, err)
}

// With Debug, ranks that call different collectives get one error naming
// both calls.
func TestDebugMismatchReportsBothSides(t *testing.T) {
	for name, run := range backendRunners {
		t.Run(name, func(t *testing.T) {
			err := run(t, 2, Options{Debug: true, Timeout: 5 * time.Second}, func(g Group) error {
				for range 16 {
					if err := g.Barrier(); err != nil {
						return err
					}
				}
				if g.Rank() == 0 {
					return g.AllReduce(tensor.Default.New(tensor.Comm, tensor.Float32, 4096), Sum)
				}
				return g.AllGather(tensor.Default.New(tensor.Comm, tensor.Float32, 1024), tensor.Default.New(tensor.Comm, tensor.Float32, 2048))
			})
			want := `comm: rank 0 called all_reduce(4096 float32) but rank 1 called all_gather(1024 float32) at seq 17 on group "world"`
			errs := rankErrors(err)
			assert.Equal(t, "rank 0: "+want, errs[0])
			assert.Equal(t, "rank 1: "+want, errs[1])
		})
	}
}

// Without Debug a mismatch is still caught at the first frame.
func TestMismatchWithoutDebugIsCaught(t *testing.T) {
	err := RunLocal(2, Options{Timeout: 5 * time.Second}, func(g Group) error {
		if g.Rank() == 0 {
			return g.AllReduce(tensor.Default.New(tensor.Comm, tensor.Float32, 16), Sum)
		}
		return g.Broadcast(tensor.Default.New(tensor.Comm, tensor.Float32, 16), 0)
	})
	errs := rankErrors(err)
	assert.Contains(t, errs[1], `comm: broadcast on group "world" seq 1: rank 0 sent all_reduce (float32) seq 1 step 0 while this rank ran broadcast (float32) seq 1 step 0`)
}

func TestConnectionWithoutTokenIsRefused(t *testing.T) {
	logs := &syncBuffer{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := startStore(ln, testToken, 2, logs)
	defer srv.close()
	addr := ln.Addr().String()
	deadline := time.Now().Add(5 * time.Second)

	_, err = dialStore(addr, "not-the-token", 1, 2, deadline)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "connection refused by the remote side: wrong or missing job token (TINYACC_JOB_TOKEN)")
	assert.Regexp(t, `comm: store refused connection from 127\.0\.0\.1:\d+: wrong or missing job token`, logs.String())

	// Garbage instead of a hello is refused without harming the store.
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	_, _ = c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + strings.Repeat("x", 64)))
	buf := make([]byte, 1)
	_, rerr := c.Read(buf) // the store closes the connection
	assert.Error(t, rerr)
	c.Close()

	// The right token still works.
	sc, err := dialStore(addr, testToken, 1, 2, deadline)
	require.NoError(t, err)
	require.NoError(t, sc.set("k", []byte("v"), deadline))
	v, err := sc.get("k", deadline)
	require.NoError(t, err)
	assert.Equal(t, "v", string(v))
	sc.close()
	// The second refusal came within a second of the first: it is counted
	// in a summary line, written at the latest when the store closes.
	srv.close()
	assert.Regexp(t, `comm: store refused 1 more connection within a second; the last from 127\.0\.0\.1:\d+: bad hello: malformed frame: bad magic`, logs.String())
}

func TestPeerListenerRefusesWrongToken(t *testing.T) {
	logs := &syncBuffer{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	env := EnvInfo{Rank: 0, Size: 2, Token: testToken}
	peers := make([]*peerConn, 2)
	done := make(chan error, 1)
	go func() { done <- acceptPeers(ln, env, logs, peers, time.Now().Add(5*time.Second)) }()

	deadline := time.Now().Add(5 * time.Second)
	bad, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	err = clientHello(bad, bad, hello{V: protocolVersion, Token: "guess", Rank: 1, World: 2, Role: "peer"}, deadline)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "wrong or missing job token")
	bad.Close()

	good, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer good.Close()
	require.NoError(t, clientHello(good, good, hello{V: protocolVersion, Token: testToken, Rank: 1, World: 2, Role: "peer"}, deadline))
	require.NoError(t, <-done)
	require.NotNil(t, peers[1])
	peers[1].conn.Close()
	assert.Regexp(t, `comm: rank 0 refused connection from 127\.0\.0\.1:\d+: wrong or missing job token`, logs.String())
}
