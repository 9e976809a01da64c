package comm

import (
	"fmt"
	"time"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// Opcodes tag data frames so a rank that runs a different operation than its
// peer is caught at the first frame instead of reducing the wrong bytes.
const (
	opAllReduce uint8 = iota + 1
	opReduceScatter
	opAllGather
	opAllGatherV
	opBroadcast
	opReduce
	opBarrier
	opP2P
)

var opNames = map[uint8]string{
	opAllReduce: "all_reduce", opReduceScatter: "reduce_scatter", opAllGather: "all_gather",
	opAllGatherV: "all_gather_v", opBroadcast: "broadcast", opReduce: "reduce",
	opBarrier: "barrier", opP2P: "send/recv",
}

func opName(code uint8) string {
	if n, ok := opNames[code]; ok {
		return n
	}
	return fmt.Sprintf("op(%d)", code)
}

// opCtx is one running operation: its tags, deadline and the ranks whose
// failure dooms it.
type opCtx struct {
	g        *group
	op       *op
	start    time.Time
	deadline time.Time
	watch    []int // world ranks whose giving up (abortNote) fails the operation
}

func (c *opCtx) size() int { return len(c.g.ranks) }
func (c *opCtx) me() int   { return c.g.me }

// sendChunk sends one frame of a message to group rank peer on channel ch.
func (c *opCtx) sendChunk(ch uint16, peer int, step uint32, dt tensor.DType, off int, chunk []byte, last bool) error {
	h := header{kind: kindData, dtype: uint8(dt), op: c.op.code, ch: ch, step: step,
		length: uint32(len(chunk)), group: c.g.id, seq: c.op.seq, offset: uint64(off)}
	if last {
		h.flags = flagLast
	}
	if err := c.g.w.tr.send(c.g.ranks[peer], &h, chunk, c.deadline); err != nil {
		return err
	}
	if ch != chDebug {
		c.g.sent.Add(int64(len(chunk)))
		c.g.w.sent.Add(int64(len(chunk)))
	}
	return nil
}

// sendMsg streams data to group rank peer in chunks of Options.ChunkBytes.
func (c *opCtx) sendMsg(ch uint16, peer int, step uint32, dt tensor.DType, data []byte) error {
	chunk := c.g.w.opts.ChunkBytes
	if len(data) == 0 {
		return c.sendChunk(ch, peer, step, dt, 0, nil, true)
	}
	for off := 0; off < len(data); off += chunk {
		end := min(off+chunk, len(data))
		if err := c.sendChunk(ch, peer, step, dt, off, data[off:end], end == len(data)); err != nil {
			return err
		}
	}
	return nil
}

// sendAsync runs sendMsg on its own goroutine so the caller can receive (and
// reduce) while its data is on the wire. At most one send per peer may be in
// flight, since chunks of two messages to one peer must not interleave.
func (c *opCtx) sendAsync(peer int, step uint32, dt tensor.DType, data []byte) <-chan error {
	errc := make(chan error, 1)
	go func() { errc <- c.sendMsg(c.op.ch, peer, step, dt, data) }()
	return errc
}

// recvMsg receives the message of (step) from group rank peer: exactly want
// bytes, handed to fn chunk by chunk in order.
func (c *opCtx) recvMsg(ch uint16, peer int, step uint32, dt tensor.DType, want int, fn func(off int, chunk []byte, last bool) error) error {
	box := c.g.w.tr.inbox()
	key := boxKey{src: c.g.ranks[peer], group: c.g.id, ch: ch}
	got := 0
	for {
		msg, err := box.take(key, c.deadline, c.watch)
		if err != nil {
			return err
		}
		h := msg.h
		if h.seq != c.op.seq || h.op != c.op.code || h.step != step || h.dtype != uint8(dt) {
			box.release(msg)
			return &protocolError{fmt.Sprintf(
				"rank %d sent %s (%s) seq %d step %d while this rank ran %s (%s) seq %d step %d: ranks called different operations (TINYACC_DEBUG=detail reports both calls)",
				c.g.ranks[peer], opName(h.op), tensor.DType(h.dtype), h.seq, h.step,
				opName(c.op.code), dt, c.op.seq, step)}
		}
		n := len(msg.data)
		if h.offset != uint64(got) || got+n > want || (h.flags&flagLast != 0 && got+n != want) {
			box.release(msg)
			return &protocolError{fmt.Sprintf("rank %d sent a message of a different size: chunk at byte %d of length %d, last=%v, but this rank expects %d bytes (tensor sizes differ between ranks)",
				c.g.ranks[peer], h.offset, n, h.flags&flagLast != 0, want)}
		}
		last := h.flags&flagLast != 0
		err = fn(got, msg.data, last)
		box.release(msg)
		if err != nil {
			return err
		}
		got += n
		if last {
			return nil
		}
	}
}

// recvInto receives a message straight into dst.
func (c *opCtx) recvInto(peer int, step uint32, dt tensor.DType, dst []byte) error {
	return c.recvMsg(c.op.ch, peer, step, dt, len(dst), func(off int, chunk []byte, _ bool) error {
		copy(dst[off:], chunk)
		return nil
	})
}

// recvReduce receives a message and reduces it into dst: dst = a op msg.
func (c *opCtx) recvReduce(peer int, step uint32, dt tensor.DType, op ReduceOp, dst, a []byte) error {
	return c.recvMsg(c.op.ch, peer, step, dt, len(dst), func(off int, chunk []byte, _ bool) error {
		reduceBytes(dt, op, dst[off:off+len(chunk)], a[off:off+len(chunk)], chunk)
		return nil
	})
}

// protocolError is a disagreement between ranks (different operations or
// sizes): no rank is missing, so no probing is needed to explain it.
type protocolError struct{ msg string }

func (e *protocolError) Error() string { return e.msg }
