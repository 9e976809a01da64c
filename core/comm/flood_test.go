package comm

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// peakRSS returns this process's peak resident set (VmHWM) in bytes.
func peakRSS() (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmHWM in /proc/self/status")
}

// flood opens n connections to addr, each sending only a frame header that
// claims a 1 MiB hello, and returns once the store has dropped every one
// (or the hello deadline has passed for it).
func flood(addr string, n int) {
	var hb [headerSize]byte
	h := header{kind: kindHello, length: 1 << 20}
	h.encode(hb[:])
	var wg sync.WaitGroup
	sem := make(chan struct{}, 256) // this side's own file descriptors
	for i := 0; i < n; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				return
			}
			defer c.Close()
			if _, err := c.Write(hb[:]); err != nil {
				return
			}
			_ = c.SetReadDeadline(time.Now().Add(helloTimeout + 5*time.Second))
			var b [64]byte
			for {
				if _, err := c.Read(b[:]); err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
}

// Thousands of strangers each claiming a 1 MiB hello on rank 0's store,
// while the job runs: the store refuses each from its header alone, rank
// 0's memory stays where it was, and the job's collectives are exact.
func TestStoreFloodKeepsMemoryFlat(t *testing.T) {
	if _, err := os.Stat("/proc/self/clear_refs"); err != nil {
		t.Skip("needs /proc/self/clear_refs to reset the peak RSS")
	}
	const conns = 3000
	log := &syncBuffer{}
	err := RunTCPLocal(2, Options{Timeout: 30 * time.Second, Log: log}, func(g Group) error {
		if g.Rank() == 0 {
			addr := g.(*group).w.tr.(*tcpTransport).server.ln.Addr().String()
			if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
				return err
			}
			before, err := peakRSS()
			if err != nil {
				return err
			}
			flood(addr, conns)
			after, err := peakRSS()
			if err != nil {
				return err
			}
			if grew := after - before; grew > 50<<20 {
				return fmt.Errorf("peak RSS grew by %d MiB under the flood of %d connections", grew>>20, conns)
			}
		}
		for k := 0; k < 3; k++ {
			x := filled(tensor.Float32, g.Rank(), 4096, k)
			if err := g.AllReduce(x, Sum); err != nil {
				return err
			}
			if got, want := x.Float64s(), refReduce(tensor.Float32, Sum, 2, 4096, k); !slices.Equal(got, want) {
				return fmt.Errorf("all-reduce %d: got %v..., want %v...", k, got[:4], want[:4])
			}
		}
		return nil
	})
	require.NoError(t, err)
	// The first refusal is logged in full: the claimed hello refused from
	// its header, or, when more than the store keeps waiting arrive at once,
	// the oldest dropped before its header was read.
	require.Regexp(t, `^comm: store refused connection from 127\.0\.0\.1:\d+: (.*exceeds the limit of 4096|no hello before it was dropped)`, log.String())
	// One line for the first refusal, then one a second at most, not one
	// for each of the connections.
	require.Less(t, strings.Count(log.String(), "\n"), 100, log.String())
}
