//go:build linux

package comm

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"
)

// allToAllV moves the blocks of an all-to-all through the group's segment
// (shmseg.go). Every ordered pair of ranks is a stream of its own: the
// sender cuts its block for a receiver into pieces and puts piece j in its
// half j%2, at the receiver's place in it (a half holds one piece per
// other rank; a rank's own block never enters the segment); the receiver
// copies each piece straight from there into place in its output. Each
// rank copies what it sends in once and what it receives out once, the
// least a segment allows.
//
// A pair waits only for itself: a sender writes piece j for q once q has
// taken piece j-2 from that place, q takes piece j once it is written.
// Each rank keeps two counters per pair (pieces written, pieces taken),
// counted over the group's life, so a stream goes on from one all-to-all
// to the next. The simple form, rounds that every rank fills and every
// rank reads before any refills (as reduceScatter's), ties every piece to
// the slowest rank; on a host with fewer cores than ranks, where some rank
// is always off its core, that is a wait at every round. Here a rank moves
// whatever piece of any pair is ready, in the order it finds them, and
// only when none is copies a piece of its own block or sleeps on its
// doorbell, which every peer rings after it writes a piece for it or takes
// one from it: the ranks that have a core keep exchanging. (Both with the
// stores below, at 16 MiB from each of 4 ranks on 2 cores, the streams
// took 0.68 to 0.99 of the rounds' time in three runs side by side.)
//
// The copies use non-temporal stores (copyNT): an all-to-all's bytes pass
// through once, and ordinary stores would first read every line they write
// into the cache, from memory for the output, evicting the segment the
// other ranks are about to read. Go's copy does the same by itself (on
// amd64) only for moves of 1 MiB or more, and a piece is a half over n-1
// ranks; at 16 MiB from each of 4 ranks on 2 cores these stores alone made
// the all-to-all 1.1 to 2.3× faster in runs side by side.
//
// For the rounds of the other collectives an all-to-all is two rounds, one
// per half: it starts once every rank has finished every round before
// (both halves free) and ends, for each rank, once it has written and
// taken all its pieces.
//
// With uneven blocks (AllToAllV) the ranks first spend one round telling
// each other their send and receive sizes, so each knows how many pieces
// every stream carries, and every rank checks every pair: a receiver that
// expects another size than its sender sends fails on every rank with the
// same message, before any data moves.
func (s *shmSeg) allToAllV(c *opCtx, in, out []byte, sendOff, recvOff []int, uneven bool) error {
	n, me := s.n, s.me
	piece := (s.slot / (n - 1)) &^ 63
	if piece == 0 || (uneven && 16*n > s.slot) {
		return fmt.Errorf("a segment half of %d bytes is too small for an all-to-all of %d ranks (raise Options.ChunkBytes)", s.slot, n)
	}
	desc := descOf(c, len(in))
	if uneven {
		desc = descOf(c, 0) // sizes differ by rank; the size round checks them
	}
	sent := 0
	for p := 0; p < n; p++ {
		if p != me {
			sent += sendOff[p+1] - sendOff[p]
		}
	}
	c.countSent(sent)
	if uneven {
		if err := s.exchangeSizes(c, desc, sendOff, recvOff); err != nil {
			return err
		}
	}
	k := s.round
	s.round += 2
	if err := s.waitAll(c, ctrRead, k); err != nil {
		return err
	}
	s.desc(me, 0).Store(desc)
	s.desc(me, 1).Store(desc)
	at := func(sender, q int) int { // where a sender's half holds its piece for q
		if q > sender {
			q--
		}
		return q * piece
	}
	pieces := func(bytes int) int { return (bytes + piece - 1) / piece }
	// The pieces of this all-to-all written for and taken from each rank,
	// and how many of all are still to write or take.
	wrote, took, left := make([]int, n), make([]int, n), 0
	for p := 0; p < n; p++ {
		if p != me {
			left += pieces(sendOff[p+1]-sendOff[p]) + pieces(recvOff[p+1]-recvOff[p])
		}
	}
	ownLo, ownHi := sendOff[me], sendOff[me+1]
	own := out[recvOff[me]:recvOff[me+1]]
	var since time.Time // when this rank first found nothing to do
	for left > 0 || ownLo < ownHi {
		bell := s.bell(me).Load()
		moved := false
		for i := 1; i < n; i++ {
			if q := (me + i) % n; wrote[q] < pieces(sendOff[q+1]-sendOff[q]) {
				j := s.wrote(me, q).Load()
				if j < s.took(q, me).Load()+2 {
					o := sendOff[q] + wrote[q]*piece
					copyNT(s.half(me, int(j%2))[at(me, q):], in[o:min(o+piece, sendOff[q+1])])
					s.wrote(me, q).Store(j + 1)
					s.ring(q)
					wrote[q]++
					left--
					moved = true
				}
			}
			if p := (me - i + n) % n; took[p] < pieces(recvOff[p+1]-recvOff[p]) {
				j := s.took(me, p).Load()
				if s.wrote(p, me).Load() > j {
					if took[p] == 0 {
						if err := s.agree(c, 0, desc, []int{p}); err != nil {
							return err
						}
					}
					o := recvOff[p] + took[p]*piece
					dst := out[o:min(o+piece, recvOff[p+1])]
					copyNT(dst, s.half(p, int(j%2))[at(p, me):at(p, me)+len(dst)])
					s.took(me, p).Store(j + 1)
					s.ring(p)
					took[p]++
					left--
					moved = true
				}
			}
		}
		if moved {
			since = time.Time{}
			continue
		}
		if ownLo < ownHi {
			m := min(piece, ownHi-ownLo)
			copyNT(own[:m], in[ownLo:ownLo+m])
			own, ownLo = own[m:], ownLo+m
			continue
		}
		if since.IsZero() {
			since = time.Now()
		}
		if err := s.sleepBell(c, bell, since, func(p int) bool {
			return wrote[p] < pieces(sendOff[p+1]-sendOff[p]) || took[p] < pieces(recvOff[p+1]-recvOff[p])
		}); err != nil {
			return err
		}
	}
	s.ctr(me, ctrCopied).Store(k + 2)
	s.end(k + 1)
	return nil
}

// streamRow is the bytes of a rank's row of stream counters: for every
// rank q the pieces this rank wrote for q, then for every rank p the
// pieces it took from p (uint64 each, counted over the group's life),
// whole cache line pairs so that no two ranks write one line.
func streamRow(n int) int { return (16*n + segLine - 1) / segLine * segLine }

func (s *shmSeg) stream(r, i int) *atomic.Uint64 {
	off := segCtlFirst + s.n*segLine + r*streamRow(s.n) + 8*i
	return (*atomic.Uint64)(unsafe.Pointer(&s.mem[off]))
}

// wrote counts the pieces rank r wrote for rank q, took those rank r took
// from rank p.
func (s *shmSeg) wrote(r, q int) *atomic.Uint64 { return s.stream(r, q) }
func (s *shmSeg) took(r, p int) *atomic.Uint64  { return s.stream(r, s.n+p) }

// bell is rank r's doorbell, which a peer rings (adds one to) after it
// moves a piece r may be waiting for; bellSleepers says whether r sleeps
// on it.
func (s *shmSeg) bell(r int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&s.mem[segCtlFirst+r*segLine+segBell]))
}

func (s *shmSeg) bellSleepers(r int) *atomic.Int32 {
	return (*atomic.Int32)(unsafe.Pointer(&s.mem[segCtlFirst+r*segLine+segBell+4]))
}

// ring rings rank r's doorbell, waking it if it sleeps. It adds before it
// looks at the sleepers, and a sleeper counts itself in before the futex
// checks the bell, so either the ring sees the sleeper or the sleeper's
// futex sees the ring.
func (s *shmSeg) ring(r int) {
	s.bell(r).Add(1)
	if s.bellSleepers(r).Load() > 0 {
		futexWakeAll(s.bell(r))
	}
}

// sleepBell sleeps until this rank's doorbell moves from bell (read before
// the rank last looked for work), as waitOne sleeps on a counter: held for
// the first segHold since the rank found nothing to do, then as usual;
// between sleeps it checks the deadline and every rank it still exchanges
// with (pending), so it fails as waitOne fails, naming the rank.
func (s *shmSeg) sleepBell(c *opCtx, bell uint32, since time.Time, pending func(p int) bool) error {
	for p := 0; p < s.n; p++ {
		if p != s.me && pending(p) {
			if segWaitHook != nil {
				segWaitHook(c, s.ranks[p])
			}
			if err := c.segAlive(s.ranks[p]); err != nil {
				// p may have written its last pieces, rung and left
				// since this rank last looked: they are in the
				// segment, so look again before failing.
				if s.bell(s.me).Load() != bell {
					return nil
				}
				return err
			}
		}
	}
	s.bellSleepers(s.me).Add(1)
	if s.bell(s.me).Load() == bell {
		if time.Since(since) < segHold {
			futexHold(s.bell(s.me), bell, min(segHoldPoll, max(time.Until(c.deadline), time.Microsecond)))
		} else {
			futexWait(s.bell(s.me), bell, min(segPoll, max(time.Until(c.deadline), time.Millisecond)))
		}
	}
	s.bellSleepers(s.me).Add(-1)
	return nil
}

// exchangeSizes is the size round of an uneven all-to-all: each rank puts
// its n send sizes and n receive sizes (bytes, uint64) in its half; every
// rank reads all of them and checks that each receiver expects what its
// sender sends.
func (s *shmSeg) exchangeSizes(c *opCtx, desc uint64, sendOff, recvOff []int) error {
	n := s.n
	k, h, err := s.begin(c, desc)
	if err != nil {
		return err
	}
	mine := s.half(s.me, h)
	for p := 0; p < n; p++ {
		binary.LittleEndian.PutUint64(mine[8*p:], uint64(sendOff[p+1]-sendOff[p]))
		binary.LittleEndian.PutUint64(mine[8*(n+p):], uint64(recvOff[p+1]-recvOff[p]))
	}
	s.post(ctrCopied, k+1)
	if err := s.waitAll(c, ctrCopied, k+1); err != nil {
		return err
	}
	if err := s.agree(c, h, desc, nil); err != nil {
		return err
	}
	defer s.end(k)
	for p := 0; p < n; p++ {
		for q := 0; q < n; q++ {
			sends := binary.LittleEndian.Uint64(s.half(p, h)[8*q:])
			expects := binary.LittleEndian.Uint64(s.half(q, h)[8*(n+p):])
			if sends != expects {
				return &protocolError{fmt.Sprintf(
					"rank %d sends %d bytes to rank %d, which expects %d: every rank's recvCounts[p] must equal rank p's sendCounts for it",
					c.g.ranks[s.ranks[p]], sends, c.g.ranks[s.ranks[q]], expects)}
			}
		}
	}
	return nil
}
