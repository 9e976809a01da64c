//go:build linux

package comm

import (
	"slices"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// A group spread over several hosts, some with more than one of its ranks,
// runs its collectives in three parts: within each host through the host's
// shared segment (shmseg.go), across hosts over messages between one leader
// per host (its lowest group rank), and within each host again. Only the
// leaders' messages cross the network, once per host instead of once per
// rank.
//
// Reduction order, the same on every rank and every run whatever the
// timing: each host first folds its ranks in rank order (as a segment
// does), then the host results are folded in the order of the hosts' lowest
// group ranks. When every host holds a contiguous run of ranks (ranks 0-1
// on one host, 2-3 on the next) that is ((x0+x1)+(x2+x3)): grouped by
// host, which is not the flat rank order of a group on one host, so sums
// of values that round differ from it in the last bits; values that add
// exactly (integers) give the same result on every path.
//
// Deadlines and errors are those of the group's operation: every wait, on
// the segment or for a message, ends at its deadline or when a rank it waits
// on dies or gives up, and names the rank that did not arrive.

type spreadColl struct {
	hosts [][]int // group ranks of each host, hosts in order of their lowest rank
	mine  int     // this rank's host
	idx   int     // this rank's index on its host; 0 is the host's leader
	seg   *shmSeg // the host's segment; nil when this rank is alone on its host
}

// setupSpread makes the segment of this rank's host, then the leaders agree
// across hosts that every host has one and tell their members. When any host
// could not make one, the whole group works over messages (nil), since all
// ranks must run the same algorithm.
func setupSpread(c *opCtx, hosts [][]int) (*spreadColl, error) {
	single := true
	for _, h := range hosts {
		single = single && len(h) == 1
	}
	if single {
		return nil, nil // no host to share memory on
	}
	sp := &spreadColl{hosts: hosts}
	for h, members := range hosts {
		if i := slices.Index(members, c.me()); i >= 0 {
			sp.mine, sp.idx = h, i
		}
	}
	local := hosts[sp.mine]
	var ok [4]byte
	ok[0] = 1
	if len(local) > 1 {
		s, err := setupSegment(c, local)
		if err != nil {
			return nil, err
		}
		sp.seg = s
		if s == nil {
			ok[0] = 0
		}
	}
	if sp.idx == 0 {
		for h := range hosts {
			if h != sp.mine {
				if err := c.sendMsg(chDebug, hosts[h][0], setupStep+3, tensor.Int32, ok[:]); err != nil {
					return nil, sp.fail(err)
				}
			}
		}
		all := ok[0] == 1
		for h := range hosts {
			if h != sp.mine {
				var theirs [4]byte
				if err := c.recvSetup(hosts[h][0], setupStep+3, theirs[:]); err != nil {
					return nil, sp.fail(err)
				}
				all = all && theirs[0] == 1
			}
		}
		if !all {
			ok[0] = 0
		}
		for _, m := range local[1:] {
			if err := c.sendMsg(chDebug, m, setupStep+4, tensor.Int32, ok[:]); err != nil {
				return nil, sp.fail(err)
			}
		}
	} else if err := c.recvSetup(local[0], setupStep+4, ok[:]); err != nil {
		return nil, sp.fail(err)
	}
	if ok[0] != 1 {
		return nil, sp.fail(nil)
	}
	return sp, nil
}

// fail gives up the host's segment and passes err on.
func (sp *spreadColl) fail(err error) error {
	if sp.seg != nil {
		sp.seg.unmap()
		sp.seg = nil
	}
	return err
}

func (sp *spreadColl) unmap() { _ = sp.fail(nil) }

func (sp *spreadColl) leader(h int) int { return sp.hosts[h][0] }

// hostOf is the host of group rank r.
func (sp *spreadColl) hostOf(r int) int {
	for h, members := range sp.hosts {
		if slices.Contains(members, r) {
			return h
		}
	}
	panic("comm: rank on no host")
}

// localSum is the operation of the host and cross-host folds: an average
// is a sum divided once by the group size at the end.
func localSum(op ReduceOp) ReduceOp {
	if op == Avg {
		return Sum
	}
	return op
}

// hostReduce leaves the fold of the host's ranks' buf in member to's buf
// (the others' are left alone); a rank alone on its host has it already.
func (sp *spreadColl) hostReduce(c *opCtx, dt tensor.DType, op ReduceOp, buf []byte, to int) error {
	if sp.seg == nil {
		return nil
	}
	return sp.seg.allReduce(c, dt, op, buf, to)
}

// hostBroadcast copies member from's buf to the host's other ranks.
func (sp *spreadColl) hostBroadcast(c *opCtx, buf []byte, from int) error {
	if sp.seg == nil {
		return nil
	}
	return sp.seg.broadcast(c, buf, from)
}

// foldHosts sets acc to the fold, in host order, of every host's part: this
// host's is own, the others' arrive from their leaders as message step.
func (sp *spreadColl) foldHosts(c *opCtx, dt tensor.DType, op ReduceOp, acc, own []byte, step uint32) error {
	for h := range sp.hosts {
		var err error
		switch {
		case h == sp.mine && h == 0:
			copy(acc, own)
		case h == sp.mine:
			reduceBytes(dt, op, acc, acc, own)
		case h == 0:
			err = c.recvInto(sp.leader(h), step, dt, acc)
		default:
			err = c.recvReduce(sp.leader(h), step, dt, op, acc, acc)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// sendEach sends parts(h) to the leader of every other host, the parts of
// one host in order as steps 0, 1, ..., one goroutine per host; wait
// collects the first error.
func (sp *spreadColl) sendEach(c *opCtx, dt tensor.DType, parts func(h int) [][]byte) (wait func(err error) error) {
	var errcs []chan error
	for h := range sp.hosts {
		if h == sp.mine {
			continue
		}
		errc := make(chan error, 1)
		errcs = append(errcs, errc)
		go func(h int, parts [][]byte) {
			var err error
			for i, p := range parts {
				if err = c.sendMsg(c.op.ch, sp.leader(h), uint32(i), dt, p); err != nil {
					break
				}
			}
			errc <- err
		}(h, parts(h))
	}
	return func(err error) error {
		for _, errc := range errcs {
			err = waitSend(errc, err)
		}
		return err
	}
}

// allReduce leaves the reduction in buf on every rank, or only on root when
// root >= 0 (Reduce; the others' buf is left as it was).
func (sp *spreadColl) allReduce(c *opCtx, dt tensor.DType, op ReduceOp, buf []byte, root int) error {
	if root >= 0 {
		return sp.reduce(c, dt, op, buf, root)
	}
	lop := localSum(op)
	if err := sp.hostReduce(c, dt, lop, buf, 0); err != nil {
		return err
	}
	if sp.idx == 0 {
		wait := sp.sendEach(c, dt, func(int) [][]byte { return [][]byte{buf} })
		acc := c.g.scratchBuf(len(buf))
		// buf is read by the sends: fold beside it, copy in once they are done.
		if err := wait(sp.foldHosts(c, dt, lop, acc, buf, 0)); err != nil {
			return err
		}
		copy(buf, acc)
		if op == Avg {
			scaleBytes(dt, buf, c.size())
		}
	}
	return sp.hostBroadcast(c, buf, 0)
}

// reduce: root's host folds into root, every other host into its leader
// (through a copy, so that the leader's buf stays as it was), and the
// leaders send their host's result to root, which folds them in host order.
func (sp *spreadColl) reduce(c *opCtx, dt tensor.DType, op ReduceOp, buf []byte, root int) error {
	lop := localSum(op)
	rh := sp.hostOf(root)
	if sp.mine == rh {
		if err := sp.hostReduce(c, dt, lop, buf, slices.Index(sp.hosts[rh], root)); err != nil {
			return err
		}
		if c.me() != root {
			return nil
		}
		acc := c.g.scratchBuf(len(buf))
		if err := sp.foldHosts(c, dt, lop, acc, buf, 0); err != nil {
			return err
		}
		copy(buf, acc)
		if op == Avg {
			scaleBytes(dt, buf, c.size())
		}
		return nil
	}
	part := buf
	if sp.idx == 0 && sp.seg != nil {
		part = c.g.scratchBuf(len(buf))
		copy(part, buf)
	}
	if err := sp.hostReduce(c, dt, lop, part, 0); err != nil {
		return err
	}
	if sp.idx != 0 {
		return nil
	}
	return c.sendMsg(c.op.ch, root, 0, dt, part)
}

// reduceScatter leaves block me of the reduction of in (one block of
// len(out) bytes per rank) in out: each host folds the whole of in into its
// leader, the leaders send each other host the blocks of its ranks, fold
// the blocks of their own ranks in host order, and hand each rank its block
// through the segment.
func (sp *spreadColl) reduceScatter(c *opCtx, dt tensor.DType, op ReduceOp, in, out []byte) error {
	lop := localSum(op)
	bs := len(out)
	local := sp.hosts[sp.mine]
	leader := sp.idx == 0
	var part, res []byte
	if leader {
		scratch := c.g.scratchBuf(len(in) + len(local)*bs)
		part, res = in, scratch[len(in):]
		if sp.seg != nil {
			part = scratch[:len(in)]
			copy(part, in)
		}
	}
	if sp.seg != nil {
		src := in
		if leader {
			src = part
		}
		if err := sp.seg.allReduce(c, dt, lop, src, 0); err != nil {
			return err
		}
	}
	if leader {
		blocks := func(h int) [][]byte {
			var bl [][]byte
			for _, r := range sp.hosts[h] {
				bl = append(bl, part[r*bs:(r+1)*bs])
			}
			return bl
		}
		wait := sp.sendEach(c, dt, blocks)
		var err error
		for i, r := range local {
			if err = sp.foldHosts(c, dt, lop, res[i*bs:(i+1)*bs], part[r*bs:(r+1)*bs], uint32(i)); err != nil {
				break
			}
		}
		if err := wait(err); err != nil {
			return err
		}
		if op == Avg {
			scaleBytes(dt, res, c.size())
		}
		copy(out, res[:bs])
		if sp.seg != nil {
			c.countSent((len(local) - 1) * bs)
		}
	}
	if sp.seg == nil {
		return nil
	}
	return sp.seg.scatter(c, len(local)*bs, res, 0, sp.idx*bs, out)
}

// allGatherV gathers block r (bytes off[r]..off[r+1] of out) from rank r:
// the ranks of a host gather their blocks through the segment, the leaders
// exchange their hosts' blocks, and each leader passes the other hosts'
// blocks to its ranks, one scatter per run of consecutive ranks on other
// hosts.
func (sp *spreadColl) allGatherV(c *opCtx, in, out []byte, off []int) error {
	local := sp.hosts[sp.mine]
	blocks := func(h int) [][]byte {
		var bl [][]byte
		for _, r := range sp.hosts[h] {
			bl = append(bl, out[off[r]:off[r+1]])
		}
		return bl
	}
	if sp.seg != nil {
		if err := sp.seg.allGatherParts(c, in, blocks(sp.mine)); err != nil {
			return err
		}
	} else {
		copy(out[off[c.me()]:off[c.me()+1]], in)
	}
	if sp.idx == 0 {
		mine := blocks(sp.mine)
		wait := sp.sendEach(c, tensor.Int32, func(int) [][]byte { return mine })
		var err error
		for h := range sp.hosts {
			if h == sp.mine {
				continue
			}
			for i, b := range blocks(h) {
				if err = c.recvInto(sp.leader(h), uint32(i), tensor.Int32, b); err != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		if err := wait(err); err != nil {
			return err
		}
	}
	if sp.seg == nil {
		return nil
	}
	onHost := func(r int) bool { return slices.Contains(local, r) }
	for r := 0; r < c.size(); {
		if onHost(r) {
			r++
			continue
		}
		end := r
		for end < c.size() && !onHost(end) {
			end++
		}
		if lo, hi := off[r], off[end]; lo < hi {
			if sp.idx == 0 {
				c.countSent((len(local) - 1) * (hi - lo))
			}
			if err := sp.seg.scatter(c, hi-lo, out[lo:hi], 0, 0, out[lo:hi]); err != nil {
				return err
			}
		}
		r = end
	}
	return nil
}

// broadcast: root sends buf to every other host's leader and to its own
// host through the segment; each leader passes it on to its host.
func (sp *spreadColl) broadcast(c *opCtx, buf []byte, root int) error {
	rh := sp.hostOf(root)
	if sp.mine != rh {
		if sp.idx == 0 {
			if err := c.recvInto(root, 0, tensor.Int32, buf); err != nil {
				return err
			}
		}
		return sp.hostBroadcast(c, buf, 0)
	}
	wait := func(err error) error { return err }
	if c.me() == root {
		wait = sp.sendEach(c, tensor.Int32, func(int) [][]byte { return [][]byte{buf} })
	}
	return wait(sp.hostBroadcast(c, buf, slices.Index(sp.hosts[rh], root)))
}
