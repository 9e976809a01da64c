//go:build linux

package comm

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// The collectives of a group that shares one segment (shmseg.go). Each
// round of a collective is: wait until this round's half is free (every
// rank finished the round two before), copy in, announce; wait for the
// others' copies, fold the block this rank owns from all of them into place,
// announce; wait for the others' folds, copy the results out. The part of
// the block a rank owns that is its own data is never copied in: no one
// else reads it, so the fold takes it from the rank's buffer. A fold adds
// in rank order, so results are bitwise the same whatever the timing, on
// every rank, and equal to the tcp backend's direct algorithm.
//
// Buffers up to segSmall take one round in which every rank folds the
// whole buffer itself: one wait instead of two, which is what small
// messages pay for.

const segSmall = 32 << 10

// descOf names an operation and its size for the agreement check.
func descOf(c *opCtx, bytes int) uint64 { return uint64(c.op.code)<<56 | uint64(bytes) }

// begin opens the next round: it waits until its half is free and records
// what this rank's round is. A rank may open round k+1 before it ends
// round k (the collectives below copy the next round in before they
// finish this one), never further ahead: round k+2 uses round k's half.
func (s *shmSeg) begin(c *opCtx, desc uint64) (k uint64, h int, err error) {
	k = s.round
	s.round++
	h = int(k % 2)
	if k >= 2 {
		if err := s.waitAll(c, ctrRead, k-1); err != nil {
			return 0, 0, err
		}
	}
	s.desc(s.me, h).Store(desc)
	return k, h, nil
}

// end closes round k for this rank: it will not read the round's data again.
func (s *shmSeg) end(k uint64) {
	s.ctr(s.me, ctrReduced).Store(k + 1)
	s.post(ctrRead, k+1)
}

// srcs are the sources of a fold of bytes off.. of every member's half h,
// this rank's own from mine instead when mine is not nil.
func (s *shmSeg) srcs(h, off int, mine []byte) srcs {
	return srcs{base: s.base(h, off), stride: s.stride(), n: s.n, own: s.me, mine: mine}
}

// agree checks, after the copies of round k are in, that the ranks in
// ranks (all when nil) run the same operation on the same size.
func (s *shmSeg) agree(c *opCtx, h int, desc uint64, ranks []int) error {
	check := func(p int) error {
		if d := s.desc(p, h).Load(); d != desc {
			return &protocolError{fmt.Sprintf(
				"rank %d runs %s of %d bytes while this rank runs %s of %d bytes: ranks called different operations or passed tensors of different sizes",
				c.g.ranks[s.ranks[p]], opName(uint8(d>>56)), d&(1<<56-1), opName(c.op.code), desc&(1<<56-1))}
		}
		return nil
	}
	if ranks != nil {
		for _, p := range ranks {
			if err := check(p); err != nil {
				return err
			}
		}
		return nil
	}
	for p := 0; p < s.n; p++ {
		if err := check(p); err != nil {
			return err
		}
	}
	return nil
}

// countSent counts, as what this rank sent, the bytes of its data that the
// other ranks read from the segment: that is what a message would have
// carried, so it equals the message algorithms' formulas (a ring
// all-reduce's 2(N-1)/N of the buffer, (N-1)/N of the whole buffer for a
// reduce-scatter or an all-gather).
func (c *opCtx) countSent(n int) {
	c.g.sent.Add(int64(n))
	c.g.w.sent.Add(int64(n))
}

// allReduce leaves the reduction in buf on every rank, or only on root when
// root >= 0 (Reduce; the others' buf is left as it was).
func (s *shmSeg) allReduce(c *opCtx, dt tensor.DType, op ReduceOp, buf []byte, root int) error {
	desc := descOf(c, len(buf))
	esz := dt.Size()
	wants := root < 0 || root == s.me
	if len(buf) <= segSmall {
		switch {
		case root < 0:
			c.countSent((s.n - 1) * len(buf))
		case root != s.me:
			c.countSent(len(buf))
		}
		k, h, err := s.begin(c, desc)
		if err != nil {
			return err
		}
		copy(s.half(s.me, h), buf)
		s.post(ctrCopied, k+1)
		if err := s.waitAll(c, ctrCopied, k+1); err != nil {
			return err
		}
		if err := s.agree(c, h, desc, nil); err != nil {
			return err
		}
		if wants {
			fold(dt, op, buf, s.srcs(h, 0, nil), s.acc)
			if op == Avg {
				scaleBytes(dt, buf, s.n)
			}
		}
		s.end(k)
		return nil
	}
	// Each round's copy in goes before the wait for the others' folds of
	// the round before: a rank that would wait has work, and the wait is
	// likelier over when it comes.
	type round struct {
		k      uint64
		h      int
		off, m int
		blk    []int
	}
	copyIn := func(off int) (round, error) {
		r := round{off: off, m: min(s.slot, len(buf)-off)}
		var err error
		if r.k, r.h, err = s.begin(c, desc); err != nil {
			return r, err
		}
		r.blk = splitBlocks(r.m/esz, s.n, esz)
		lo, hi := r.blk[s.me], r.blk[s.me+1]
		copy(s.half(s.me, r.h)[:lo], buf[off:off+lo])
		copy(s.half(s.me, r.h)[hi:r.m], buf[off+hi:off+r.m])
		s.post(ctrCopied, r.k+1)
		if segRoundHook != nil {
			segRoundHook(r.k)
		}
		return r, nil
	}
	r, err := copyIn(0)
	if err != nil {
		return err
	}
	for {
		k, h, off, m, blk := r.k, r.h, r.off, r.m, r.blk
		if err := s.waitAll(c, ctrCopied, k+1); err != nil {
			return err
		}
		if err := s.agree(c, h, desc, nil); err != nil {
			return err
		}
		lo, hi := blk[s.me], blk[s.me+1]
		mine := s.half(s.me, h)[lo:hi]
		switch {
		case root < 0:
			c.countSent(m - len(mine) + (s.n-1)*len(mine))
		case root != s.me:
			c.countSent(m)
		default:
			c.countSent(m - len(mine))
		}
		fold(dt, op, mine, s.srcs(h, lo, buf[off+lo:off+hi]), s.acc)
		if op == Avg {
			scaleBytes(dt, mine, s.n)
		}
		s.post(ctrReduced, k+1)
		last := off+m == len(buf)
		if !last {
			if r, err = copyIn(off + m); err != nil {
				return err
			}
		}
		if wants {
			if err := s.waitAll(c, ctrReduced, k+1); err != nil {
				return err
			}
			for p := 0; p < s.n; p++ {
				copy(buf[off+blk[p]:off+blk[p+1]], s.half(p, h)[blk[p]:blk[p+1]])
			}
		}
		s.post(ctrRead, k+1)
		if last {
			return nil
		}
	}
}

// reduceScatter leaves block me of the reduction of in (n blocks of
// len(out) bytes) in out. A round carries a piece of every block from every
// rank; the owner of a block folds its pieces straight into out.
func (s *shmSeg) reduceScatter(c *opCtx, dt tensor.DType, op ReduceOp, in, out []byte) error {
	desc := descOf(c, len(in))
	bs := len(out)
	piece := (s.slot / s.n) &^ 63
	c.countSent(len(in) - len(out))
	// As in allReduce, the next round is copied in before this one's wait.
	copyIn := func(off int) (k uint64, h int, err error) {
		if k, h, err = s.begin(c, desc); err != nil {
			return 0, 0, err
		}
		m, mine := min(piece, bs-off), s.half(s.me, h)
		for b := 0; b < s.n; b++ {
			if b != s.me {
				copy(mine[b*piece:b*piece+m], in[b*bs+off:b*bs+off+m])
			}
		}
		s.post(ctrCopied, k+1)
		return k, h, nil
	}
	var k uint64
	var h int
	var err error
	if bs > 0 {
		if k, h, err = copyIn(0); err != nil {
			return err
		}
	}
	for off := 0; off < bs; off += piece {
		m := min(piece, bs-off)
		kNext, hNext := k, h
		if off+m < bs {
			if kNext, hNext, err = copyIn(off + m); err != nil {
				return err
			}
		}
		if err := s.waitAll(c, ctrCopied, k+1); err != nil {
			return err
		}
		if err := s.agree(c, h, desc, nil); err != nil {
			return err
		}
		own := in[s.me*bs+off : s.me*bs+off+m]
		fold(dt, op, out[off:off+m], s.srcs(h, s.me*piece, own), s.acc)
		s.end(k)
		k, h = kNext, hNext
	}
	if op == Avg {
		scaleBytes(dt, out, s.n)
	}
	return nil
}

// allGatherV copies every rank's in into its place (bytes off[r]..off[r+1]
// of out).
func (s *shmSeg) allGatherV(c *opCtx, in, out []byte, off []int) error {
	parts := make([][]byte, s.n)
	for p := range parts {
		parts[p] = out[off[p]:off[p+1]]
	}
	return s.allGatherParts(c, in, parts)
}

// allGatherParts copies member p's in into parts[p] on every member, in
// rounds of up to a half from each.
func (s *shmSeg) allGatherParts(c *opCtx, in []byte, parts [][]byte) error {
	total, longest := 0, 0
	for _, part := range parts {
		total += len(part)
		longest = max(longest, len(part))
	}
	desc := descOf(c, total)
	copy(parts[s.me], in)
	c.countSent((s.n - 1) * len(in))
	for o := 0; o < longest; o += s.slot {
		k, h, err := s.begin(c, desc)
		if err != nil {
			return err
		}
		if o < len(in) {
			copy(s.half(s.me, h), in[o:min(o+s.slot, len(in))])
		}
		s.post(ctrCopied, k+1)
		if err := s.waitAll(c, ctrCopied, k+1); err != nil {
			return err
		}
		if err := s.agree(c, h, desc, nil); err != nil {
			return err
		}
		for p, part := range parts {
			if p != s.me && o < len(part) {
				m := min(s.slot, len(part)-o)
				copy(part[o:o+m], s.half(p, h)[:m])
			}
		}
		s.end(k)
	}
	return nil
}

// broadcast copies root's buf through root's halves into every member's.
func (s *shmSeg) broadcast(c *opCtx, buf []byte, root int) error {
	if s.me == root {
		c.countSent((s.n - 1) * len(buf))
	}
	return s.scatter(c, len(buf), buf, root, 0, buf)
}

// scatter passes the total bytes of root's src through root's halves; every
// other member keeps its window of them, bytes lo..lo+len(dst), in dst. A
// broadcast is a scatter whose windows are the whole. The caller counts
// what root sent.
func (s *shmSeg) scatter(c *opCtx, total int, src []byte, root, lo int, dst []byte) error {
	desc := descOf(c, total)
	hi := lo + len(dst)
	for o := 0; o < total; o += s.slot {
		m := min(s.slot, total-o)
		k, h, err := s.begin(c, desc)
		if err != nil {
			return err
		}
		if s.me == root {
			copy(s.half(root, h), src[o:o+m])
		}
		s.post(ctrCopied, k+1)
		if s.me != root {
			if err := s.waitOne(c, root, ctrCopied, k+1); err != nil {
				return err
			}
			if err := s.agree(c, h, desc, []int{root}); err != nil {
				return err
			}
			if a, b := max(o, lo), min(o+m, hi); a < b {
				copy(dst[a-lo:b-lo], s.half(root, h)[a-o:b-o])
			}
		}
		s.end(k)
	}
	return nil
}
