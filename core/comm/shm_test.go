//go:build linux

package comm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/tensor"
)

func tcpOf(g Group) *tcpTransport { return g.(*group).w.tr.(*tcpTransport) }

// ringsWith lists the peers g has an outgoing and an incoming ring with.
func ringsWith(g Group) (out, in []int) {
	tr := tcpOf(g)
	for p := range tr.size {
		if tr.shmOut != nil && tr.shmOut[p] != nil {
			out = append(out, p)
		}
		if tr.shmIn != nil && tr.shmIn[p] != nil {
			in = append(in, p)
		}
	}
	return out, in
}

func othersThan(me, n int) []int {
	var r []int
	for p := range n {
		if p != me {
			r = append(r, p)
		}
	}
	return r
}

// ringFiles lists ring files this process created; all ranks of the
// in-process runner share its pid.
func ringFiles(t *testing.T) []string {
	t.Helper()
	m, err := filepath.Glob(fmt.Sprintf("%s/tinyacc-%d-*", shmDir, os.Getpid()))
	require.NoError(t, err)
	return m
}

// With shared memory every pair of in-process ranks gets a ring each way,
// the ring files are gone once rendezvous is over, and the collectives match
// the serial reference. The odd chunk size makes payloads of many lengths
// wrap around the ring, and the large all-reduce runs through it several
// times.
func TestShmCollectivesMatchReference(t *testing.T) {
	t.Setenv("TINYACC_SHM", "1")
	const n = 4
	require.NoError(t, runTCP(t, n, Options{ChunkBytes: 3*4096 + 8}, func(g Group) error {
		if err := g.Barrier(); err != nil {
			return err
		}
		out, in := ringsWith(g)
		if want := othersThan(g.Rank(), n); !assert.ObjectsAreEqual(want, out) || !assert.ObjectsAreEqual(want, in) {
			return fmt.Errorf("rings out %v in %v, want both %v", out, in, want)
		}
		if files := ringFiles(t); len(files) != 0 {
			return fmt.Errorf("ring files left after rendezvous: %v", files)
		}
		if err := checkAllOps(g, []tensor.DType{tensor.Float32, tensor.Float64, tensor.Int32, tensor.BFloat16, tensor.Float16}); err != nil {
			return err
		}
		const cnt = 1<<20 + 3
		for _, dt := range []tensor.DType{tensor.Float32, tensor.Float64} {
			x := filled(dt, g.Rank(), cnt, 7)
			if err := g.AllReduce(x, Sum); err != nil {
				return err
			}
			if err := expectEq(fmt.Sprintf("large all_reduce %s", dt), x, refReduce(dt, Sum, n, cnt, 7)); err != nil {
				return err
			}
		}
		return nil
	}))
	assert.Empty(t, ringFiles(t))
}

// TINYACC_SHM=0 keeps everything on TCP, silently, with the same results.
func TestShmDisabledUsesTCP(t *testing.T) {
	t.Setenv("TINYACC_SHM", "0")
	var log syncBuffer
	require.NoError(t, runTCP(t, 3, Options{ChunkBytes: 4096, Log: &log}, func(g Group) error {
		if out, in := ringsWith(g); len(out)+len(in) != 0 {
			return fmt.Errorf("rings out %v in %v with TINYACC_SHM=0", out, in)
		}
		return checkAllOps(g, []tensor.DType{tensor.Float32})
	}))
	assert.Empty(t, log.String())
	assert.Empty(t, ringFiles(t))
}

// A ring that cannot be created leaves its pair on TCP: the collectives
// still match, and each rank says so in one line.
func TestShmSetupFailureFallsBackToTCP(t *testing.T) {
	t.Setenv("TINYACC_SHM", "1")
	saved := shmDir
	shmDir = filepath.Join(t.TempDir(), "missing")
	defer func() { shmDir = saved }()
	var log syncBuffer
	const n = 3
	require.NoError(t, runTCP(t, n, Options{ChunkBytes: 4096, Log: &log}, func(g Group) error {
		if out, in := ringsWith(g); len(out)+len(in) != 0 {
			return fmt.Errorf("rings out %v in %v although none could be created", out, in)
		}
		return checkAllOps(g, []tensor.DType{tensor.Float32})
	}))
	// One line per rank for its rings, and one from rank 0, which could
	// not make the world group's segment either.
	lines := strings.Split(strings.TrimSpace(log.String()), "\n")
	require.Len(t, lines, n+1, log.String())
	rings := 0
	for _, l := range lines {
		if strings.Contains(l, "group") {
			assert.Regexp(t, `^comm: rank 0: group "world": shared memory unavailable, its collectives use messages: no such file or directory$`, l)
			continue
		}
		rings++
		assert.Regexp(t, `^comm: rank [0-2]: shared memory unavailable, those transfers use tcp: ring from rank [0-2]: no such file or directory; ring from rank [0-2]: no such file or directory$`, l)
	}
	assert.Equal(t, n, rings, log.String())
}

// A sender waiting for ring space notices when its receiver dies and fails
// with the usual error naming it. Rank 0's ring to rank 1 is made to look
// full, so the first step of the ring all-reduce waits; rank 1 dies once
// rank 0 is waiting.
func TestShmSenderWaitingForSpaceSeesDeadPeer(t *testing.T) {
	t.Setenv("TINYACC_SHM", "1")
	const n = 4
	waiting := make(chan struct{})
	var once sync.Once
	err := runTCP(t, n, Options{Timeout: 2 * time.Second}, func(g Group) error {
		if err := g.Barrier(); err != nil { // seq 1
			return err
		}
		x := filled(tensor.Float32, g.Rank(), 1<<20, 0)
		switch g.Rank() {
		case 0:
			r := tcpOf(g).shmOut[1]
			if r == nil {
				once.Do(func() { close(waiting) })
				return errors.New("no ring to rank 1")
			}
			r.head = r.tail().Load() + uint64(len(r.data))
			r.onWait = func() { once.Do(func() { close(waiting) }) }
		case 1:
			<-waiting
			h := g.AllReduceAsync(x, Sum) // seq 2, then die
			_ = g.(*group).abort()
			_ = h.Wait()
			return errors.New("stopped on purpose")
		}
		return g.AllReduce(x, Sum)
	})
	errs := rankErrors(err)
	require.Len(t, errs, n, "every rank fails: %v", err)
	for _, r := range []int{0, 2, 3} {
		assert.Regexp(t, fmt.Sprintf(`^rank %d: comm: all_reduce on group "world" seq 2 failed after [0-9.]+(µs|ms|s): ranks \[1\] did not arrive \(rank 1: connection closed\)$`, r), errs[r])
	}
	assert.Empty(t, ringFiles(t))
}

// A sender whose ring stays full fails at the operation's deadline.
func TestShmSenderWaitingForSpaceTimesOut(t *testing.T) {
	r := &shmRing{peer: 5, mem: make([]byte, shmHeaderBytes+8192)}
	r.data = r.mem[shmHeaderBytes:]
	r.head = uint64(len(r.data)) // full: the receiver consumed nothing
	_, err := r.write(make([]byte, 64), time.Now().Add(30*time.Millisecond), func() error { return nil })
	assert.EqualError(t, err, "timed out waiting for rank 5")
}

// place keeps payloads whole and aligned: compared with a direct
// simulation of the ring's byte positions.
func TestShmPlacement(t *testing.T) {
	const c = 64
	r := &shmRing{data: make([]byte, c)}
	head := uint64(0)
	pos := 0 // position in the ring, simulated byte by byte
	for _, n := range []int{8, 20, 36, 4, 1, 64, 30, 30, 13} {
		start, end := r.place(head, n)
		if pos+n > c {
			pos = 0
		}
		assert.Equal(t, uint64(pos), start%c, "start of a %d-byte payload", n)
		assert.Zero(t, start%8, "payloads start aligned")
		padded := (n + 7) / 8 * 8
		assert.Equal(t, start+uint64(padded), end)
		pos = (pos + padded) % c
		head = end
	}
}

// Ring files never outlive their job, even when a rank is killed mid-
// operation: after the processes of the kill scenario are gone, no ring
// file of a process that no longer exists is left in /dev/shm.
func TestShmNoFilesLeftByKilledProcesses(t *testing.T) {
	outs := startRanks(t, 4, "kill")
	require.Contains(t, result(outs[0]), "ranks [3] did not arrive")
	files, err := filepath.Glob(shmDir + "/tinyacc-*")
	require.NoError(t, err)
	for _, f := range files {
		var pid int
		if _, err := fmt.Sscanf(filepath.Base(f), "tinyacc-%d-", &pid); err != nil {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); os.IsNotExist(err) {
			t.Errorf("ring file %s of exited process %d was left behind", f, pid)
		}
	}
}

// residentBytes is the Rss that /proc/self/smaps gives for the mapping
// that starts at addr.
func residentBytes(addr uintptr) (int, error) {
	b, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return 0, err
	}
	start := fmt.Sprintf("%x-", addr)
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			in = strings.HasPrefix(f[0], start)
			continue
		}
		if in && strings.HasPrefix(line, "Rss:") {
			var kb int
			if _, err := fmt.Sscanf(strings.TrimPrefix(line, "Rss:"), "%d kB", &kb); err != nil {
				return 0, fmt.Errorf("%q: %w", line, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no mapping at %#x in /proc/self/smaps", addr)
}

// Every ring is resident in full, on both sides, before its first frame:
// a rank's memory does not climb page by page as frames move through the
// rings over a long run. What a rank's rings hold resident is what
// RingBytes tells the memory estimate.
func TestShmRingsResidentFromSetup(t *testing.T) {
	require.NoError(t, runTCP(t, 3, Options{}, func(g Group) error {
		tr := tcpOf(g)
		rings, resident := 0, 0
		for _, r := range append(append([]*shmRing{}, tr.shmIn...), tr.shmOut...) {
			if r == nil {
				continue
			}
			rings++
			rss, err := residentBytes(uintptr(unsafe.Pointer(&r.mem[0])))
			if err != nil {
				return err
			}
			if rss != len(r.mem) {
				return fmt.Errorf("ring with rank %d: %d of %d bytes resident", r.peer, rss, len(r.mem))
			}
			resident += rss
		}
		if rings != 4 {
			return fmt.Errorf("%d rings, want one each way with each of 2 peers", rings)
		}
		if want := RingBytes(2, Options{}); int64(resident) != want {
			return fmt.Errorf("the rings hold %d bytes resident, RingBytes says %d", resident, want)
		}
		return nil
	}))
}
