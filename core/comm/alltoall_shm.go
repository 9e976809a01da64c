//go:build linux

package comm

import (
	"encoding/binary"
	"fmt"
)

// allToAllV moves the blocks of an all-to-all through the group's segment
// (shmseg.go). A round carries the next piece of every block from every
// rank: a half is cut into one piece per receiver, rank p's piece q holds
// bytes of p's block for q, and q copies its pieces straight into place.
// A rank's own block never enters the segment.
//
// With uneven blocks (AllToAllV) the ranks first spend one round telling
// each other their send and receive sizes, so all of them know how many
// rounds the longest block takes, and every rank checks every pair: a
// receiver that expects another size than its sender sends fails on every
// rank with the same message, before any data moves.
func (s *shmSeg) allToAllV(c *opCtx, in, out []byte, sendOff, recvOff []int, uneven bool) error {
	n, me := s.n, s.me
	piece := (s.slot / n) &^ 63
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
	longest := sendOff[1] - sendOff[0]
	if uneven {
		var err error
		if longest, err = s.exchangeSizes(c, desc, sendOff, recvOff); err != nil {
			return err
		}
	}
	copy(out[recvOff[me]:recvOff[me+1]], in[sendOff[me]:sendOff[me+1]])
	for o := 0; o < longest; o += piece {
		k, h, err := s.begin(c, desc)
		if err != nil {
			return err
		}
		mine := s.half(me, h)
		for p := 0; p < n; p++ {
			if lp := sendOff[p+1] - sendOff[p]; p != me && o < lp {
				m := min(piece, lp-o)
				copy(mine[p*piece:p*piece+m], in[sendOff[p]+o:sendOff[p]+o+m])
			}
		}
		s.post(ctrCopied, k+1)
		if err := s.waitAll(c, ctrCopied, k+1); err != nil {
			return err
		}
		if err := s.agree(c, h, desc, nil); err != nil {
			return err
		}
		for p := 0; p < n; p++ {
			if lp := recvOff[p+1] - recvOff[p]; p != me && o < lp {
				m := min(piece, lp-o)
				copy(out[recvOff[p]+o:recvOff[p]+o+m], s.half(p, h)[me*piece:me*piece+m])
			}
		}
		s.end(k)
	}
	return nil
}

// exchangeSizes is the size round of an uneven all-to-all: each rank puts
// its n send sizes and n receive sizes (bytes, uint64) in its half; every
// rank reads all of them, checks that each receiver expects what its sender
// sends, and returns the longest block of the whole exchange.
func (s *shmSeg) exchangeSizes(c *opCtx, desc uint64, sendOff, recvOff []int) (int, error) {
	n := s.n
	k, h, err := s.begin(c, desc)
	if err != nil {
		return 0, err
	}
	mine := s.half(s.me, h)
	for p := 0; p < n; p++ {
		binary.LittleEndian.PutUint64(mine[8*p:], uint64(sendOff[p+1]-sendOff[p]))
		binary.LittleEndian.PutUint64(mine[8*(n+p):], uint64(recvOff[p+1]-recvOff[p]))
	}
	s.post(ctrCopied, k+1)
	if err := s.waitAll(c, ctrCopied, k+1); err != nil {
		return 0, err
	}
	if err := s.agree(c, h, desc, nil); err != nil {
		return 0, err
	}
	longest := 0
	for p := 0; p < n; p++ {
		for q := 0; q < n; q++ {
			sends := binary.LittleEndian.Uint64(s.half(p, h)[8*q:])
			expects := binary.LittleEndian.Uint64(s.half(q, h)[8*(n+p):])
			if sends != expects {
				s.end(k)
				return 0, &protocolError{fmt.Sprintf(
					"rank %d sends %d bytes to rank %d, which expects %d: every rank's recvCounts[p] must equal rank p's sendCounts for it",
					c.g.ranks[p], sends, c.g.ranks[q], expects)}
			}
			if p != q {
				longest = max(longest, int(sends))
			}
		}
	}
	s.end(k)
	return longest, nil
}
