//go:build linux

package comm

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// A group whose ranks all share one host runs its collectives through one
// shared-memory segment instead of messages: every rank copies its data in
// once, the owner of each block folds it straight out of every rank's copy,
// and everyone reads the results out once (shmcoll.go). This file makes the
// segment and moves ranks from one round to the next.
//
// The segment is one tmpfs file that group rank 0 creates and unlinks at
// once, keeping only a descriptor; the others open it through
// /proc/<pid>/fd/<fd>, so it never has a name that could outlive the job,
// even when every process is killed. It is set up by the group's first
// collective (groups are made without talking to each other) with three
// small messages over the connections, and used by every later one.
//
// Layout: a control area (a cache line left unused, then one cache line
// pair per rank with its progress counters, then per rank a row of the
// all-to-all's stream counters: alltoall_shm.go), then per rank two halves
// of slotBytes each. Large collectives move in rounds of at most one half;
// round k uses half k%2, so ranks fill the next round while the slowest
// still reads the last.

const (
	segLine      = 128 // per-rank control: two cache lines, never shared
	segCtlFirst  = 64  // where the ranks' control lines start
	segSleepers  = 24  // in a rank's control line: how many wait on its counters
	segBell      = 32  // in a rank's control line: its doorbell (uint32), then how many sleep on it (int32)
	segMinSlot   = 64 << 10
	segPoll      = 10 * time.Millisecond  // how often a sleeping waiter checks deadline and peers
	segSpin      = 200                    // checks before a waiter sleeps
	segHold      = 2 * time.Millisecond   // how long a waiter sleeps holding its thread (waitOne)
	segHoldPoll  = 200 * time.Microsecond // the longest of those sleeps before other goroutines get a turn
	setupStep    = 1 << 31                // message steps of the setup exchange
	segDescWords = 2                      // per half: what the rank's current op is
)

// Progress counters of a rank: how many rounds (counted over the group's
// life) it has copied in, folded, and finished reading. Every rank advances
// all three by one per round, so they agree on what round k means.
const (
	ctrCopied = iota
	ctrReduced
	ctrRead
	ctrCount
)

// segRoundHook, when set (tests), runs on every rank once its copy of an
// all-reduce round is in, with the round's number.
var segRoundHook func(round uint64)

type shmSeg struct {
	mem   []byte
	n, me int   // members, and this rank's index among them
	ranks []int // group rank of each member (all of the group's on one host)
	slot  int   // bytes of one half
	data  int   // offset of the first slot
	round uint64
	acc   []byte // scratch tile of non-sum folds
}

// segLayout returns the control bytes (whole pages) and the half size for
// a group of n ranks and chunk size chunk. A half holds two chunks (1 MiB
// by default): every round costs the ranks two or three waits for each
// other, which on a busy host means a trip through the scheduler, so rounds
// are longer than the chunks of a message.
func segLayout(n, chunk int) (ctl, slot int) {
	ctl = (segCtlFirst + n*segLine + n*streamRow(n) + 4095) &^ 4095
	slot = (max(2*chunk, segMinSlot) + 4095) &^ 4095
	return ctl, slot
}

func (s *shmSeg) ctr(r, which int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&s.mem[segCtlFirst+r*segLine+8*which])) //nolint:gosec
}

// word is the futex word of rank r's counter which: its low 32 bits (the
// host is little-endian), which change whenever the counter does.
func (s *shmSeg) word(r, which int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&s.mem[segCtlFirst+r*segLine+8*which]))
}

// sleepers counts the ranks asleep on one of rank r's counters.
func (s *shmSeg) sleepers(r int) *atomic.Int32 {
	return (*atomic.Int32)(unsafe.Pointer(&s.mem[segCtlFirst+r*segLine+segSleepers]))
}

// desc is where rank r describes the operation of its rounds in half h, so
// that a rank that reads it knows the others agree on what they move.
func (s *shmSeg) desc(r, h int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&s.mem[segCtlFirst+r*segLine+64+8*h]))
}

// half is rank r's half h.
func (s *shmSeg) half(r, h int) []byte {
	off := s.data + (2*r+h)*s.slot
	return s.mem[off : off+s.slot : off+s.slot]
}

// base is the address of byte off of rank 0's half h; rank r's is
// stride() bytes further, which is how a fold addresses every rank's copy.
func (s *shmSeg) base(h, off int) unsafe.Pointer {
	return unsafe.Pointer(&s.mem[s.data+h*s.slot+off])
}

func (s *shmSeg) stride() int { return 2 * s.slot }

// post sets this rank's counter which to v and wakes the ranks asleep on
// it. Each counter is a futex of its own, so a post wakes only the ranks
// that wait for this rank's counter which, not every rank asleep: on a host
// with fewer cores than ranks every needless wake-up is a trip through the
// scheduler.
func (s *shmSeg) post(which int, v uint64) {
	s.ctr(s.me, which).Store(v)
	if s.sleepers(s.me).Load() > 0 {
		futexWakeAll(s.word(s.me, which))
	}
}

// waitAll returns once every other rank's counter which reached v. While
// waiting it spins a little, then sleeps on the counter's futex word,
// looking every few milliseconds at the deadline and at whether the peer
// it waits for died or gave up: a rank killed mid-collective fails the
// others at once, a stopped one at the deadline.
func (s *shmSeg) waitAll(c *opCtx, which int, v uint64) error {
	for p := 0; p < s.n; p++ {
		if p != s.me {
			if err := s.waitOne(c, p, which, v); err != nil {
				return err
			}
		}
	}
	return nil
}

// waitOne returns once rank p's counter which reached v.
//
// For its first segHold a waiter sleeps without telling the Go runtime
// (futexHold): a collective waits for its peers many times, mostly for
// well under a millisecond, and a sleep the runtime knows of hands this
// thread's processor to another thread and keeps the runtime's monitor
// thread waking every 20µs, several more trips through the scheduler per
// wait. Those sleeps last at most segHoldPoll each, and between two the
// other goroutines get a turn (ranks of one process among them, in tests),
// since the processor stays taken meanwhile. A longer wait (a peer still
// computing) sleeps as usual.
func (s *shmSeg) waitOne(c *opCtx, p, which int, v uint64) error {
	ctr := s.ctr(p, which)
	var slept time.Time
	for spins := 0; ctr.Load() < v; spins++ {
		if spins < segSpin {
			if spins%16 == 15 {
				runtime.Gosched()
			}
			continue
		}
		if segWaitHook != nil {
			segWaitHook(c, s.ranks[p])
		}
		if err := c.segAlive(s.ranks[p]); err != nil {
			// p may have posted, finished and left between the look
			// above and this check: what it posted stands.
			if ctr.Load() >= v {
				return nil
			}
			return err
		}
		// Count in, then look again: post stores the counter before it
		// reads the count, so either this look sees the counter or post
		// sees the sleeper and wakes the futex (which returns at once if
		// the counter moved since this look).
		if slept.IsZero() {
			slept = time.Now()
		}
		hold := time.Since(slept) < segHold
		s.sleepers(p).Add(1)
		if cur := ctr.Load(); cur < v {
			if hold {
				futexHold(s.word(p, which), uint32(cur), min(segHoldPoll, max(time.Until(c.deadline), time.Microsecond)))
				runtime.Gosched()
			} else {
				futexWait(s.word(p, which), uint32(cur), min(segPoll, max(time.Until(c.deadline), time.Millisecond)))
			}
		}
		s.sleepers(p).Add(-1)
	}
	return nil
}

// segWaitHook, set only by tests, runs where a segment wait has found
// nothing and is about to ask whether group rank p is still alive.
var segWaitHook func(c *opCtx, p int)

// segAlive is nil while group rank p may still arrive: the deadline has not
// passed, p is alive, and no member gave up this operation.
func (c *opCtx) segAlive(p int) error {
	wr := c.g.ranks[p]
	if !time.Now().Before(c.deadline) {
		return &waitError{peer: wr, timeout: true}
	}
	box := c.g.w.tr.inbox()
	if why, dead := box.deadReason(wr); dead {
		return &waitError{peer: wr, why: why}
	}
	for _, w := range c.watch {
		if n := box.note(w, c.g.id); n != nil && n.Seq >= c.op.seq {
			return &waitError{peer: w, note: n}
		}
	}
	if lv, ok := c.g.w.tr.(interface{ peerFailure(int) error }); ok {
		return lv.peerFailure(wr)
	}
	return nil
}

func (s *shmSeg) unmap() {
	if s.mem != nil {
		_ = syscall.Munmap(s.mem)
		s.mem = nil
	}
}

// futexHold is futexWait as a raw system call: the runtime takes this
// thread for running, keeps its processor with it and is not told. Only
// for short sleeps: a collection or another goroutine of this processor
// waits until it returns (the runtime's preemption signal ends it early).
func futexHold(addr *atomic.Uint32, val uint32, d time.Duration) {
	const futexWaitOp = 0
	ts := syscall.NsecToTimespec(int64(d))
	_, _, _ = syscall.RawSyscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWaitOp, uintptr(val),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
}

func futexWakeAll(addr *atomic.Uint32) {
	const futexWakeOp = 1
	_, _, _ = syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWakeOp, 1<<30, 0, 0, 0)
}

// segmentHost is the transport of a backend whose ranks can share memory:
// hostsOf splits the given world ranks by host (indexes into worldRanks,
// hosts in order of their first rank), or is nil when shared memory is off.
type segmentHost interface {
	hostsOf(worldRanks []int) [][]int
}

// hostsOf implements segmentHost. A rank without a host identity shares
// memory with no one: it is a host of its own.
func (t *tcpTransport) hostsOf(ranks []int) [][]int {
	if !t.shmOn || len(t.hostIDs) != t.size {
		return nil
	}
	var hosts [][]int
	at := map[string]int{}
	for i, r := range ranks {
		id := t.hostIDs[r]
		if h, ok := at[id]; ok && id != "" {
			hosts[h] = append(hosts[h], i)
			continue
		}
		at[id] = len(hosts)
		hosts = append(hosts, []int{i})
	}
	return hosts
}

// segment returns the group's shared-memory segment, setting it up on the
// first call, or nil when the group works over messages or spans hosts (then
// g.spread, set up by the same call, says how: spread.go). Every rank calls
// it at the same collective, so the setup's messages pair up.
func (g *group) segment(c *opCtx) (*shmSeg, error) {
	switch g.segState {
	case segOn:
		return g.seg, nil
	case segOff:
		return nil, nil
	}
	g.segState = segOff
	sh, ok := g.w.tr.(segmentHost)
	if !ok || len(g.ranks) < 2 {
		return nil, nil
	}
	hosts := sh.hostsOf(g.ranks)
	if len(hosts) > 1 {
		sp, err := setupSpread(c, hosts)
		g.spread = sp
		return nil, err
	}
	if hosts == nil {
		return nil, nil
	}
	s, err := setupSegment(c, hosts[0])
	if err != nil || s == nil {
		return nil, err
	}
	g.seg, g.segState = s, segOn
	return s, nil
}

// setupSegment makes the segment of members (group ranks on one host, this
// rank among them): the first creates and maps the segment and sends every
// other where to find it (pid and descriptor, zero when it could not); each
// maps it and answers 0 or 1; the first sends the verdict to all. Only when
// every member mapped it is it used; otherwise the group stays on messages,
// and the ranks that failed say why in one log line.
func setupSegment(c *opCtx, members []int) (*shmSeg, error) {
	n, me := len(members), slices.Index(members, c.me())
	ctl, slot := segLayout(n, c.g.w.opts.ChunkBytes)
	size := ctl + 2*n*slot
	s := &shmSeg{n: n, me: me, ranks: members, slot: slot, data: ctl, acc: make([]byte, foldTile)}
	var problem error
	if me == 0 {
		fd, mem, err := createSegment(size)
		if err != nil {
			problem = err
		} else {
			defer syscall.Close(fd)
			s.mem = mem
		}
		var where [16]byte
		if err == nil {
			binary.LittleEndian.PutUint64(where[:], uint64(os.Getpid()))
			binary.LittleEndian.PutUint64(where[8:], uint64(fd))
		}
		ok := err == nil
		for p := 1; p < n; p++ {
			if err := c.sendMsg(chDebug, members[p], setupStep, tensor.Int32, where[:]); err != nil {
				s.unmap()
				return nil, err
			}
		}
		var reply [4]byte
		for p := 1; p < n; p++ {
			if err := c.recvSetup(members[p], setupStep+1, reply[:]); err != nil {
				s.unmap()
				return nil, err
			}
			ok = ok && reply[0] == 1
		}
		if ok {
			reply[0] = 1
		} else {
			reply[0] = 0
		}
		for p := 1; p < n; p++ {
			if err := c.sendMsg(chDebug, members[p], setupStep+2, tensor.Int32, reply[:]); err != nil {
				s.unmap()
				return nil, err
			}
		}
		if !ok {
			s.unmap()
			s = nil
		}
	} else {
		var where [16]byte
		if err := c.recvSetup(members[0], setupStep, where[:]); err != nil {
			return nil, err
		}
		pid, fd := binary.LittleEndian.Uint64(where[:]), binary.LittleEndian.Uint64(where[8:])
		var reply [4]byte
		if pid != 0 {
			mem, err := openSegment(fmt.Sprintf("/proc/%d/fd/%d", pid, fd), size)
			if err != nil {
				problem = err
			} else {
				s.mem = mem
				reply[0] = 1
			}
		}
		if err := c.sendMsg(chDebug, members[0], setupStep+1, tensor.Int32, reply[:]); err != nil {
			s.unmap()
			return nil, err
		}
		if err := c.recvSetup(members[0], setupStep+2, reply[:]); err != nil {
			s.unmap()
			return nil, err
		}
		if reply[0] != 1 {
			s.unmap()
			s = nil
		}
	}
	if problem != nil {
		fmt.Fprintf(c.g.w.opts.Log, "comm: rank %d: group %q: shared memory unavailable, its collectives use messages: %v\n",
			c.g.ranks[c.me()], c.g.name, problem)
	}
	return s, nil
}

// recvSetup receives a message of the setup exchange. Like the
// fingerprints of Debug mode it travels on the debug channel, so it counts
// as no payload of the group.
func (c *opCtx) recvSetup(peer int, step uint32, dst []byte) error {
	return c.recvMsg(chDebug, peer, step, tensor.Int32, len(dst), func(off int, chunk []byte, _ bool) error {
		copy(dst[off:], chunk)
		return nil
	})
}

// createSegment makes the segment file, reserves its memory (a full tmpfs
// fails here rather than with SIGBUS later), maps it and unlinks it: from
// then on only the descriptor and the mappings hold it.
func createSegment(size int) (int, []byte, error) {
	var tag [8]byte
	_, _ = rand.Read(tag[:])
	path := fmt.Sprintf("%s/tinyacc-seg-%d-%s", shmDir, os.Getpid(), hex.EncodeToString(tag[:]))
	fd, err := syscall.Open(path, syscall.O_RDWR|syscall.O_CREAT|syscall.O_EXCL|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return -1, nil, err
	}
	_ = syscall.Unlink(path)
	if err := syscall.Fallocate(fd, 0, 0, int64(size)); err != nil {
		syscall.Close(fd)
		return -1, nil, fmt.Errorf("reserving %d bytes in %s: %w", size, shmDir, err)
	}
	mem, err := syscall.Mmap(fd, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		syscall.Close(fd)
		return -1, nil, err
	}
	return fd, mem, nil
}

// openSegment maps the segment another rank created, through its
// descriptor's /proc entry.
func openSegment(path string, size int) ([]byte, error) {
	fd, err := syscall.Open(path, syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Size != int64(size) {
		return nil, fmt.Errorf("%s has %d bytes, want %d (ranks disagree on the chunk size)", path, st.Size, size)
	}
	return syscall.Mmap(fd, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
}
