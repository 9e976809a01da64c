package comm

import (
	"github.com/tinyacc/tinyacc/core/tensor"
)

// Buffers up to smallBytes use direct algorithms (every rank talks to every
// rank once): one round trip of latency beats the 2(N-1) steps of a ring
// when the data is small. Larger buffers use bandwidth-optimal rings.
const smallBytes = 32 << 10

// splitBlocks cuts n elements into parts blocks whose sizes differ by at most
// one, returning byte offsets (len parts+1).
func splitBlocks(n, parts, esize int) []int {
	off := make([]int, parts+1)
	for i := 0; i <= parts; i++ {
		off[i] = (i * n / parts) * esize
	}
	return off
}

func mod(a, n int) int { return ((a % n) + n) % n }

func waitSend(errc <-chan error, err error) error {
	if serr := <-errc; err == nil {
		err = serr
	}
	return err
}

// ringReduceScatterInPlace runs the reduce-scatter half of a ring on buf cut
// at off: after it, block me of buf holds the full reduction. Step s sends
// block me-s-1 (reduced s times) to the next rank and folds block me-s-2
// from the previous one into place.
func ringReduceScatterInPlace(c *opCtx, dt tensor.DType, op ReduceOp, buf []byte, off []int) error {
	n, me := c.size(), c.me()
	next, prev := mod(me+1, n), mod(me-1, n)
	for s := 0; s < n-1; s++ {
		sb, rb := mod(me-s-1, n), mod(me-s-2, n)
		errc := c.sendAsync(next, uint32(s), dt, buf[off[sb]:off[sb+1]])
		dst := buf[off[rb]:off[rb+1]]
		err := c.recvReduce(prev, uint32(s), dt, op, dst, dst)
		if err = waitSend(errc, err); err != nil {
			return err
		}
	}
	return nil
}

// ringAllGatherInPlace runs the all-gather half: block me of buf is final on
// entry; step s forwards block me-s and receives block me-s-1.
func ringAllGatherInPlace(c *opCtx, dt tensor.DType, buf []byte, off []int, step0 int) error {
	n, me := c.size(), c.me()
	next, prev := mod(me+1, n), mod(me-1, n)
	for s := 0; s < n-1; s++ {
		sb, rb := mod(me-s, n), mod(me-s-1, n)
		errc := c.sendAsync(next, uint32(step0+s), dt, buf[off[sb]:off[sb+1]])
		err := c.recvInto(prev, uint32(step0+s), dt, buf[off[rb]:off[rb+1]])
		if err = waitSend(errc, err); err != nil {
			return err
		}
	}
	return nil
}

// directExchangeReduce sends mine to every rank in sendTo and, when gather is
// set, reduces every rank's contribution in rank order (0, 1, ..., n-1) into
// it, so every receiver computes bitwise the same result.
func directExchangeReduce(c *opCtx, dt tensor.DType, op ReduceOp, mine []byte, sendTo []int, gather bool, into []byte) error {
	n, me := c.size(), c.me()
	errcs := make([]<-chan error, 0, len(sendTo))
	for _, p := range sendTo {
		if p != me {
			errcs = append(errcs, c.sendAsync(p, 0, dt, mine))
		}
	}
	var err error
	if gather {
		// into may be mine (in place): fold rank order into a copy first.
		acc := c.g.scratchBuf(len(mine))
		for r := 0; r < n && err == nil; r++ {
			switch {
			case r == me && r == 0:
				copy(acc, mine)
			case r == me:
				reduceBytes(dt, op, acc, acc, mine)
			case r == 0:
				err = c.recvInto(r, 0, dt, acc)
			default:
				err = c.recvReduce(r, 0, dt, op, acc, acc)
			}
		}
	}
	// Sends read mine, which may be into: finish them before writing.
	for _, errc := range errcs {
		err = waitSend(errc, err)
	}
	if err == nil && gather {
		copy(into, c.g.scratchBuf(len(mine)))
	}
	return err
}

func allReduce(c *opCtx, dt tensor.DType, op ReduceOp, buf []byte) error {
	if isHalf(dt) {
		return reduceHalf(c, dt, op, buf, true)
	}
	if s, err := c.g.segment(c); s != nil || err != nil {
		if err != nil {
			return err
		}
		return s.allReduce(c, dt, op, buf, -1)
	}
	if sp := c.g.spread; sp != nil {
		return sp.allReduce(c, dt, op, buf, -1)
	}
	n := c.size()
	if n > 1 {
		if len(buf) <= smallBytes {
			all := make([]int, n)
			for i := range all {
				all[i] = i
			}
			if err := directExchangeReduce(c, dt, op, buf, all, true, buf); err != nil {
				return err
			}
		} else {
			off := splitBlocks(len(buf)/dt.Size(), n, dt.Size())
			if err := ringReduceScatterInPlace(c, dt, op, buf, off); err != nil {
				return err
			}
			if op == Avg {
				// Divide the owned block before it is shared so all ranks
				// hold the same bits.
				scaleBytes(dt, buf[off[c.me()]:off[c.me()+1]], n)
				return ringAllGatherInPlace(c, dt, buf, off, n-1)
			}
			return ringAllGatherInPlace(c, dt, buf, off, n-1)
		}
	}
	if op == Avg {
		scaleBytes(dt, buf, n)
	}
	return nil
}

// reduceScatter reduces in (n equal blocks) and leaves block me in out
// without touching in: partial sums travel through two scratch blocks.
func reduceScatter(c *opCtx, dt tensor.DType, op ReduceOp, in, out []byte) error {
	if isHalf(dt) {
		return reduceScatterHalf(c, dt, op, in, out)
	}
	if s, err := c.g.segment(c); s != nil || err != nil {
		if err != nil {
			return err
		}
		return s.reduceScatter(c, dt, op, in, out)
	}
	if sp := c.g.spread; sp != nil {
		return sp.reduceScatter(c, dt, op, in, out)
	}
	n, me := c.size(), c.me()
	bs := len(out)
	blk := func(b int) []byte { return in[b*bs : (b+1)*bs] }
	switch {
	case n == 1:
		copy(out, in)
	case len(in) <= smallBytes:
		// Direct: send block p to rank p, fold the blocks addressed to me in
		// rank order.
		errcs := make([]<-chan error, 0, n-1)
		for p := 0; p < n; p++ {
			if p != me {
				errcs = append(errcs, c.sendAsync(p, 0, dt, blk(p)))
			}
		}
		acc := c.g.scratchBuf(bs)
		var err error
		for r := 0; r < n && err == nil; r++ {
			switch {
			case r == me && r == 0:
				copy(acc, blk(me))
			case r == me:
				reduceBytes(dt, op, acc, acc, blk(me))
			case r == 0:
				err = c.recvInto(r, 0, dt, acc)
			default:
				err = c.recvReduce(r, 0, dt, op, acc, acc)
			}
		}
		for _, errc := range errcs {
			err = waitSend(errc, err)
		}
		if err != nil {
			return err
		}
		copy(out, acc)
	default:
		next, prev := mod(me+1, n), mod(me-1, n)
		scratch := c.g.scratchBuf(2 * bs)
		part := [2][]byte{scratch[:bs], scratch[bs:]}
		for s := 0; s < n-1; s++ {
			sb, rb := mod(me-s-1, n), mod(me-s-2, n)
			src := blk(sb)
			if s > 0 {
				src = part[(s-1)%2]
			}
			dst := part[s%2]
			if s == n-2 {
				dst = out
			}
			errc := c.sendAsync(next, uint32(s), dt, src)
			err := c.recvReduce(prev, uint32(s), dt, op, dst, blk(rb))
			if err = waitSend(errc, err); err != nil {
				return err
			}
		}
	}
	if op == Avg {
		scaleBytes(dt, out, n)
	}
	return nil
}

// allGatherV gathers block r (bytes off[r]..off[r+1] of out) from rank r.
func allGatherV(c *opCtx, dt tensor.DType, in, out []byte, off []int) error {
	if s, err := c.g.segment(c); s != nil || err != nil {
		if err != nil {
			return err
		}
		return s.allGatherV(c, in, out, off)
	}
	if sp := c.g.spread; sp != nil {
		return sp.allGatherV(c, in, out, off)
	}
	n, me := c.size(), c.me()
	copy(out[off[me]:off[me+1]], in)
	if n == 1 {
		return nil
	}
	if len(out) <= smallBytes {
		errcs := make([]<-chan error, 0, n-1)
		for p := 0; p < n; p++ {
			if p != me {
				errcs = append(errcs, c.sendAsync(p, 0, dt, in))
			}
		}
		var err error
		for r := 0; r < n && err == nil; r++ {
			if r != me {
				err = c.recvInto(r, 0, dt, out[off[r]:off[r+1]])
			}
		}
		for _, errc := range errcs {
			err = waitSend(errc, err)
		}
		return err
	}
	return ringAllGatherInPlace(c, dt, out, off, 0)
}

// broadcast sends root's buf directly to every rank when small, else down a
// chain root -> root+1 -> ... where each rank forwards a chunk as soon as it
// has it, so a large buffer streams through all links at once.
func broadcast(c *opCtx, dt tensor.DType, buf []byte, root int) error {
	if s, err := c.g.segment(c); s != nil || err != nil {
		if err != nil {
			return err
		}
		return s.broadcast(c, buf, root)
	}
	if sp := c.g.spread; sp != nil {
		return sp.broadcast(c, buf, root)
	}
	n, me := c.size(), c.me()
	if n == 1 {
		return nil
	}
	if len(buf) <= smallBytes || n == 2 {
		if me != root {
			return c.recvInto(root, 0, dt, buf)
		}
		var err error
		for p := 0; p < n; p++ {
			if p != root {
				if e := c.sendMsg(c.op.ch, p, 0, dt, buf); err == nil {
					err = e
				}
			}
		}
		return err
	}
	pos := mod(me-root, n)
	next, prev := mod(me+1, n), mod(me-1, n)
	if pos == 0 {
		return c.sendMsg(c.op.ch, next, 0, dt, buf)
	}
	return c.recvMsg(c.op.ch, prev, 0, dt, len(buf), func(off int, chunk []byte, last bool) error {
		copy(buf[off:], chunk)
		if pos == n-1 {
			return nil
		}
		return c.sendChunk(c.op.ch, next, 0, dt, off, buf[off:off+len(chunk)], last)
	})
}

// reduce leaves the reduction in root's buf: direct when small, else a ring
// reduce-scatter after which every rank hands its finished block to root.
func reduce(c *opCtx, dt tensor.DType, op ReduceOp, buf []byte, root int) error {
	if isHalf(dt) {
		return reduceToRoot(c, dt, op, buf)
	}
	if s, err := c.g.segment(c); s != nil || err != nil {
		if err != nil {
			return err
		}
		return s.allReduce(c, dt, op, buf, root)
	}
	if sp := c.g.spread; sp != nil {
		return sp.allReduce(c, dt, op, buf, root)
	}
	n, me := c.size(), c.me()
	if n > 1 {
		if len(buf) <= smallBytes {
			if err := directExchangeReduce(c, dt, op, buf, []int{root}, me == root, buf); err != nil {
				return err
			}
		} else {
			off := splitBlocks(len(buf)/dt.Size(), n, dt.Size())
			if err := ringReduceScatterInPlace(c, dt, op, buf, off); err != nil {
				return err
			}
			if op == Avg {
				scaleBytes(dt, buf[off[me]:off[me+1]], n)
			}
			if me != root {
				return c.sendMsg(c.op.ch, root, uint32(n), dt, buf[off[me]:off[me+1]])
			}
			for r := 0; r < n; r++ {
				if r != root {
					if err := c.recvInto(r, uint32(n), dt, buf[off[r]:off[r+1]]); err != nil {
						return err
					}
				}
			}
			return nil
		}
	}
	if op == Avg && me == root {
		scaleBytes(dt, buf, n)
	}
	return nil
}

// barrier exchanges an empty message with every rank.
func barrier(c *opCtx) error {
	n, me := c.size(), c.me()
	var err error
	for p := 0; p < n; p++ {
		if p != me {
			if e := c.sendMsg(c.op.ch, p, 0, tensor.Int32, nil); err == nil {
				err = e
			}
		}
	}
	for p := 0; p < n && err == nil; p++ {
		if p != me {
			err = c.recvInto(p, 0, tensor.Int32, nil)
		}
	}
	return err
}
