package comm

import (
	"fmt"
	"unsafe"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// All-to-all: every rank sends a block of its input to every rank and
// receives one block from each, the exchange that carries tokens to the
// experts that live on other ranks and back. AllToAll cuts the input into
// equal blocks; AllToAllV takes per-peer counts, since routed tokens are
// rarely spread evenly. Both run on the group's collective queue like any
// other collective, with its deadline and error naming.
//
// Over messages (the local backend, tcp between hosts or with shared memory
// off) each rank sends block p straight to rank p and receives every block
// addressed to it: one message per pair, (N-1)/N of the input on the wire.
// Through a same-host segment (alltoall_shm.go) every rank copies its
// blocks in once and each receiver copies its own out, every pair of ranks
// a stream of its own.

// The operations' codes tag data frames and segment rounds like the others'
// (msg.go); they sit apart from that list so it can grow without moving them.
const (
	opAllToAll  uint8 = 32
	opAllToAllV uint8 = 33
)

func init() {
	opNames[opAllToAll] = "all_to_all"
	opNames[opAllToAllV] = "all_to_all_v"
}

// checkAllToAllArgs checks AllToAll's tensors for a group of n ranks.
func checkAllToAllArgs(in, out *tensor.Tensor, n int) error {
	if err := checkTensors(in, out); err != nil {
		return err
	}
	if in.Numel()%n != 0 {
		return fmt.Errorf("input has %d elements, not a multiple of the group size %d", in.Numel(), n)
	}
	if out.Numel() != in.Numel() {
		return fmt.Errorf("output has %d elements, want the input's %d", out.Numel(), in.Numel())
	}
	return checkDisjoint(in, out)
}

// checkAllToAllVArgs checks AllToAllV's arguments for a group of n ranks and
// returns where each peer's block starts in in and in out, in elements (n+1
// offsets each, the last the total).
func checkAllToAllVArgs(in, out *tensor.Tensor, sendCounts, recvCounts []int, n int) (sendOff, recvOff []int, err error) {
	if err := checkTensors(in, out); err != nil {
		return nil, nil, err
	}
	offsets := func(what string, counts []int, t *tensor.Tensor, role string) ([]int, error) {
		if len(counts) != n {
			return nil, fmt.Errorf("%d %s for a group of size %d", len(counts), what, n)
		}
		off := make([]int, n+1)
		for r, k := range counts {
			if k < 0 {
				return nil, fmt.Errorf("negative %s[%d] = %d", what, r, k)
			}
			off[r+1] = off[r] + k
		}
		if t.Numel() != off[n] {
			return nil, fmt.Errorf("%s has %d elements, want the sum of %s %d", role, t.Numel(), what, off[n])
		}
		return off, nil
	}
	if sendOff, err = offsets("sendCounts", sendCounts, in, "input"); err != nil {
		return nil, nil, err
	}
	if recvOff, err = offsets("recvCounts", recvCounts, out, "output"); err != nil {
		return nil, nil, err
	}
	return sendOff, recvOff, checkDisjoint(in, out)
}

// checkDisjoint refuses an output that shares memory with the input: the
// blocks still being sent would be overwritten by the ones arriving.
func checkDisjoint(in, out *tensor.Tensor) error {
	a, b := bytesOf(in), bytesOf(out)
	if len(a) == 0 || len(b) == 0 {
		return nil
	}
	a0, b0 := uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&b[0]))
	if a0 < b0+uintptr(len(b)) && b0 < a0+uintptr(len(a)) {
		return fmt.Errorf("input and output share memory; all-to-all does not work in place (give it a separate output)")
	}
	return nil
}

func (g *group) AllToAll(in, out *tensor.Tensor) error { return g.AllToAllAsync(in, out).Wait() }

func (g *group) AllToAllAsync(in, out *tensor.Tensor) Handle {
	const name = "all_to_all"
	n := len(g.ranks)
	if err := checkAllToAllArgs(in, out, n); err != nil {
		return g.reject(name, err)
	}
	dt, ib, ob := in.DType(), bytesOf(in), bytesOf(out)
	off := splitBlocks(in.Numel(), n, dt.Size())
	fp := fingerprint{Op: name, Count: int64(in.Numel()), DType: dt.String()}
	return g.submitColl(name, opAllToAll, fp, func(c *opCtx) error {
		return allToAllV(c, dt, ib, ob, off, off, false)
	})
}

func (g *group) AllToAllV(in, out *tensor.Tensor, sendCounts, recvCounts []int) error {
	return g.AllToAllVAsync(in, out, sendCounts, recvCounts).Wait()
}

func (g *group) AllToAllVAsync(in, out *tensor.Tensor, sendCounts, recvCounts []int) Handle {
	const name = "all_to_all_v"
	sendOff, recvOff, err := checkAllToAllVArgs(in, out, sendCounts, recvCounts, len(g.ranks))
	if err != nil {
		return g.reject(name, err)
	}
	dt := in.DType()
	for r := range sendOff {
		sendOff[r] *= dt.Size()
		recvOff[r] *= dt.Size()
	}
	ib, ob := bytesOf(in), bytesOf(out)
	// Counts differ from rank to rank, so the fingerprint holds only what
	// every rank shares; a block of the wrong size is caught on arrival.
	fp := fingerprint{Op: name, DType: dt.String()}
	return g.submitColl(name, opAllToAllV, fp, func(c *opCtx) error {
		return allToAllV(c, dt, ib, ob, sendOff, recvOff, true)
	})
}

// allToAllV sends bytes sendOff[p]..sendOff[p+1] of in to rank p and
// receives rank r's block into bytes recvOff[r]..recvOff[r+1] of out.
// uneven says the ranks' blocks may differ in size, which a segment must
// learn before it can agree on its rounds.
func allToAllV(c *opCtx, dt tensor.DType, in, out []byte, sendOff, recvOff []int, uneven bool) error {
	if s, err := c.g.segment(c); s != nil || err != nil {
		if err != nil {
			return err
		}
		return s.allToAllV(c, in, out, sendOff, recvOff, uneven)
	}
	n, me := c.size(), c.me()
	copy(out[recvOff[me]:recvOff[me+1]], in[sendOff[me]:sendOff[me+1]])
	// Peers in the order me+1, me+2, ...: each rank starts with a different
	// peer, so no rank's inbound link takes every first message at once.
	errcs := make([]<-chan error, 0, n-1)
	for i := 1; i < n; i++ {
		p := (me + i) % n
		errcs = append(errcs, c.sendAsync(p, 0, dt, in[sendOff[p]:sendOff[p+1]]))
	}
	var err error
	for i := 1; i < n && err == nil; i++ {
		p := (me - i + n) % n
		err = c.recvInto(p, 0, dt, out[recvOff[p]:recvOff[p+1]])
	}
	for _, errc := range errcs {
		err = waitSend(errc, err)
	}
	return err
}
