//go:build linux

package comm

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Setting up the shared-memory rings of shm.go during rendezvous, and
// releasing them.

// RingBytes is the shared memory a process of the tcp backend maps for
// its rings to peers other ranks of its host: one ring in each direction
// per peer, each a header page and the data area shmRingBytes sizes for
// o's chunk (2 MiB at the default 512 KiB), mapped populated
// (ringMapFlags), so all of it is in the process's resident memory from
// rendezvous on (RssShmem). Each ring is one tmpfs file mapped by both of
// its ends: the host holds half of what its processes' resident memory
// counts. 0 when TINYACC_SHM keeps every transfer on TCP.
func RingBytes(peers int, o Options) int64 {
	if peers <= 0 || !shmEnabled() {
		return 0
	}
	o = o.withDefaults()
	return int64(2*peers) * int64(shmHeaderBytes+shmRingBytes(o.ChunkBytes))
}

// shmRingBytes sizes the data area of a ring for the chunk size: room for
// four chunks, within the bounds, in whole pages.
func shmRingBytes(chunk int) int {
	n := min(max(4*chunk, shmMinRing), shmMaxRing)
	return (n + shmHeaderBytes - 1) &^ (shmHeaderBytes - 1)
}

// ringMapFlags maps a ring whole at once. Frames move through a ring's
// space in order, so a lazily mapped ring would enter a rank's resident
// memory page by page over thousands of steps (the pages themselves exist
// from fallocate on): a slow climb that looks like a leak until the whole
// ring has been used once. Populated, the ring counts in full from the
// start and resident memory stays flat.
const ringMapFlags = syscall.MAP_SHARED | syscall.MAP_POPULATE

// createRing makes and maps the ring file of one incoming direction. The
// space is reserved with fallocate so that a full /dev/shm fails here rather
// than with SIGBUS on first touch.
func createRing(path string, peer, dataBytes int) (*shmRing, error) {
	fd, err := syscall.Open(path, syscall.O_RDWR|syscall.O_CREAT|syscall.O_EXCL|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd)
	size := shmHeaderBytes + dataBytes
	if err := syscall.Fallocate(fd, 0, 0, int64(size)); err != nil {
		_ = syscall.Unlink(path)
		return nil, fmt.Errorf("reserving %d bytes in %s: %w", size, shmDir, err)
	}
	mem, err := syscall.Mmap(fd, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, ringMapFlags)
	if err != nil {
		_ = syscall.Unlink(path)
		return nil, err
	}
	return &shmRing{peer: peer, mem: mem, data: mem[shmHeaderBytes:], path: path}, nil
}

// openRing maps a ring the receiver created and unlinks its file at once:
// both sides hold it now, and an unlinked file cannot outlive them.
func openRing(path string, peer int) (*shmRing, error) {
	fd, err := syscall.Open(path, syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd)
	defer syscall.Unlink(path)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Size <= shmHeaderBytes || st.Size > shmHeaderBytes+shmMaxRing {
		return nil, fmt.Errorf("%s has %d bytes, not a ring", path, st.Size)
	}
	mem, err := syscall.Mmap(fd, 0, int(st.Size), syscall.PROT_READ|syscall.PROT_WRITE, ringMapFlags)
	if err != nil {
		return nil, err
	}
	return &shmRing{peer: peer, mem: mem, data: mem[shmHeaderBytes:]}, nil
}

// shmEnabled reads TINYACC_SHM: "0" or "false" keep every transfer on TCP
// (other values are refused when the environment is read).
func shmEnabled() bool {
	switch os.Getenv("TINYACC_SHM") {
	case "0", "false":
		return false
	}
	return true
}

func ringKey(src, dst int) string {
	return "tinyacc/shm/" + strconv.Itoa(src) + "/" + strconv.Itoa(dst)
}

// setupShm runs during rendezvous, after the mesh is up: ranks publish their
// host id, receivers create one ring per same-host sender and publish its
// file (or "" when they could not), and senders map what they were given.
// Every failure short of the store itself leaves that pair on TCP and is
// reported in one log line. Each rank publishes before it reads, so no rank
// waits on one that waits on it.
func (t *tcpTransport) setupShm(deadline time.Time) error {
	t.shmIn = make([]*shmRing, t.size)
	t.shmOut = make([]*shmRing, t.size)
	var problems []string
	ids, err := t.exchangeHostIDs(deadline)
	if err != nil {
		return err
	}
	local := sameHostPeers(ids, t.rank)
	t.hostIDs, t.shmOn = ids, shmEnabled()
	if !t.shmOn {
		local = make([]bool, t.size)
	}
	var tag [6]byte
	_, _ = rand.Read(tag[:])
	dataBytes := shmRingBytes(t.opts.ChunkBytes)
	for src := 0; src < t.size; src++ {
		if !local[src] {
			continue
		}
		path := fmt.Sprintf("%s/tinyacc-%d-%s-%dto%d", shmDir, os.Getpid(), hex.EncodeToString(tag[:]), src, t.rank)
		ring, err := createRing(path, src, dataBytes)
		if err != nil {
			problems = append(problems, fmt.Sprintf("ring from rank %d: %v", src, err))
			path = ""
		}
		t.shmIn[src] = ring
		if err := t.store.set(ringKey(src, t.rank), []byte(path), deadline); err != nil {
			return err
		}
	}
	for dst := 0; dst < t.size; dst++ {
		if !local[dst] {
			continue
		}
		v, err := t.store.get(ringKey(t.rank, dst), deadline)
		if err != nil {
			return fmt.Errorf("comm: rank %d waiting for the shared-memory ring of rank %d: %w", t.rank, dst, err)
		}
		if len(v) == 0 {
			continue // the receiver could not make one; it logged why
		}
		ring, err := openRing(string(v), dst)
		if err != nil {
			problems = append(problems, fmt.Sprintf("ring to rank %d: %v", dst, err))
			continue
		}
		t.shmOut[dst] = ring
	}
	linked := make([]bool, t.size)
	for p := range linked {
		linked[p] = t.shmIn[p] != nil && t.shmOut[p] != nil
	}
	logLinks(t.opts.Log, t.rank, ids, linked)
	if len(problems) > 0 {
		fmt.Fprintf(t.opts.Log, "comm: rank %d: shared memory unavailable, those transfers use tcp: %s\n", t.rank, strings.Join(problems, "; "))
	}
	return nil
}

// unlinkShm removes the ring files this rank created. It runs once every
// rank finished rendezvous (so every sender mapped its ring); senders
// already unlinked them, this covers a sender that failed before.
func (t *tcpTransport) unlinkShm() {
	for _, r := range t.shmIn {
		if r != nil {
			r.unlink()
		}
	}
}

// releaseShm unmaps every ring. Incoming rings must no longer be read (the
// readers ended); outgoing ones are taken under their connection's write
// lock, so a sender still inside write finishes before the memory goes.
func (t *tcpTransport) releaseShm() {
	for p, r := range t.shmOut {
		if r == nil {
			continue
		}
		if pc := t.peers[p]; pc != nil {
			pc.wmu.Lock()
			r.unmap()
			t.shmOut[p] = nil
			pc.wmu.Unlock()
		} else {
			r.unmap()
		}
	}
	for _, r := range t.shmIn {
		if r != nil {
			r.unmap()
		}
	}
}
