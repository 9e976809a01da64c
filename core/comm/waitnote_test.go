package comm

import (
	"fmt"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// freeLoopbackPort is a port on 127.0.0.1 that nothing listens on.
func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	return port
}

// RANK=1 WORLD_SIZE=2 with no rank 0 anywhere: the rank says what it waits
// for (address, port, world size) before its deadline ends the wait.
func TestRankWithoutRankZeroSaysWhatItWaitsFor(t *testing.T) {
	port := freeLoopbackPort(t)
	log := &syncBuffer{}
	env := EnvInfo{Rank: 1, Size: 2, MasterAddr: "127.0.0.1", MasterPort: port, Token: testToken, Source: "torchrun"}
	_, err := newTCP(env, Options{Timeout: 2500 * time.Millisecond, Log: log}, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cannot reach the store at 127.0.0.1:")
	want := fmt.Sprintf(`^comm: rank 1 \(world size 2\) is waiting for rank 0's store at 127\.0\.0\.1 port %d \(MASTER_ADDR, MASTER_PORT\); nothing answers there yet: is rank 0 running\? \(waited \d+s of 2\.5s\)\n$`, port)
	assert.Regexp(t, want, log.String())
}

// Rank 0 alone in a world of 2 names the rank that has not joined.
func TestRankZeroNamesTheRanksThatDidNotJoin(t *testing.T) {
	port := freeLoopbackPort(t)
	log := &syncBuffer{}
	env := EnvInfo{Rank: 0, Size: 2, MasterAddr: "127.0.0.1", MasterPort: port, Token: testToken, Source: "torchrun"}
	_, err := newTCP(env, Options{Timeout: 2500 * time.Millisecond, Log: log}, nil)
	require.Error(t, err)
	want := fmt.Sprintf(`^comm: rank 0 \(world size 2\) is waiting for ranks \[1\] to join at 127\.0\.0\.1 port %d \(MASTER_ADDR, MASTER_PORT\) \(waited \d+s of 2\.5s\)\n$`, port)
	assert.Regexp(t, want, log.String())
}

// lineCounter closes full once it has seen n lines.
type lineCounter struct {
	mu    sync.Mutex
	lines []string
	n     int
	full  chan struct{}
}

func (w *lineCounter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lines = append(w.lines, strings.TrimSuffix(string(p), "\n"))
	if len(w.lines) == w.n {
		close(w.full)
	}
	return len(p), nil
}

// The note repeats until ended, asking each time what is still missing,
// and writes nothing after end returns.
func TestWaitNoteRepeatsUntilEnded(t *testing.T) {
	w := &lineCounter{n: 3, full: make(chan struct{})}
	n := startWaitNote(w, time.Minute, time.Millisecond, time.Millisecond)
	calls := 0
	n.set(func() string { calls++; return fmt.Sprintf("waiting, report %d", calls) })
	<-w.full
	n.end()
	w.mu.Lock()
	defer w.mu.Unlock()
	require.GreaterOrEqual(t, len(w.lines), 3)
	re := regexp.MustCompile(`^comm: waiting, report (\d+) \(waited 0s of 1m0s\)$`)
	for i, l := range w.lines {
		m := re.FindStringSubmatch(l)
		require.NotNil(t, m, l)
		assert.Equal(t, fmt.Sprint(i+1), m[1])
	}
	assert.Equal(t, len(w.lines), calls, "no note after end")
}
