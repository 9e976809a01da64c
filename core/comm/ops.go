package comm

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// The public operations validate their arguments on the caller's goroutine
// (a bad call fails at once and does not use up a sequence number), then
// queue the work on the group.

func (g *group) reject(name string, err error) Handle {
	return failed{fmt.Errorf("comm: %s on group %q: %w", name, g.name, err)}
}

func checkOp(op ReduceOp, dt tensor.DType) error {
	switch op {
	case Sum, Max, Min:
		return nil
	case Avg:
		if dt == tensor.Int32 {
			return fmt.Errorf("avg needs a float dtype, got int32 (use sum and divide)")
		}
		return nil
	}
	return fmt.Errorf("unknown reduce op %d", int(op))
}

func (g *group) AllReduce(t *tensor.Tensor, op ReduceOp) error {
	return g.AllReduceAsync(t, op).Wait()
}

func (g *group) AllReduceAsync(t *tensor.Tensor, op ReduceOp) Handle {
	const name = "all_reduce"
	if err := checkReduceArgs(t, op); err != nil {
		return g.reject(name, err)
	}
	dt, buf := t.DType(), bytesOf(t)
	fp := fingerprint{Op: name, Count: int64(t.Numel()), DType: dt.String(), Reduce: op.String()}
	return g.submitColl(name, opAllReduce, fp, func(c *opCtx) error {
		return allReduce(c, dt, op, buf)
	})
}

func (g *group) ReduceScatter(in, out *tensor.Tensor, op ReduceOp) error {
	return g.ReduceScatterAsync(in, out, op).Wait()
}

func (g *group) ReduceScatterAsync(in, out *tensor.Tensor, op ReduceOp) Handle {
	const name = "reduce_scatter"
	if err := checkReduceScatterArgs(in, out, op, len(g.ranks)); err != nil {
		return g.reject(name, err)
	}
	dt, ib, ob := in.DType(), bytesOf(in), bytesOf(out)
	fp := fingerprint{Op: name, Count: int64(in.Numel()), DType: dt.String(), Reduce: op.String()}
	return g.submitColl(name, opReduceScatter, fp, func(c *opCtx) error {
		return reduceScatter(c, dt, op, ib, ob)
	})
}

func (g *group) AllGather(in, out *tensor.Tensor) error {
	return g.AllGatherAsync(in, out).Wait()
}

func (g *group) AllGatherAsync(in, out *tensor.Tensor) Handle {
	const name = "all_gather"
	n := len(g.ranks)
	if err := checkAllGatherArgs(in, out, n); err != nil {
		return g.reject(name, err)
	}
	dt, ib, ob := in.DType(), bytesOf(in), bytesOf(out)
	off := splitBlocks(out.Numel(), n, dt.Size())
	fp := fingerprint{Op: name, Count: int64(in.Numel()), DType: dt.String()}
	return g.submitColl(name, opAllGather, fp, func(c *opCtx) error {
		return allGatherV(c, dt, ib, ob, off)
	})
}

func (g *group) AllGatherV(in, out *tensor.Tensor, counts []int) error {
	return g.AllGatherVAsync(in, out, counts).Wait()
}

func (g *group) AllGatherVAsync(in, out *tensor.Tensor, counts []int) Handle {
	const name = "all_gather_v"
	off, err := checkAllGatherVArgs(in, out, counts, g.me, len(g.ranks))
	if err != nil {
		return g.reject(name, err)
	}
	dt := in.DType()
	for r := range off {
		off[r] *= dt.Size()
	}
	ib, ob := bytesOf(in), bytesOf(out)
	fp := fingerprint{Op: name, Count: int64(out.Numel()), DType: dt.String(), Extra: fmt.Sprint(counts)}
	return g.submitColl(name, opAllGatherV, fp, func(c *opCtx) error {
		return allGatherV(c, dt, ib, ob, off)
	})
}

func (g *group) Broadcast(t *tensor.Tensor, root int) error {
	return g.BroadcastAsync(t, root).Wait()
}

func (g *group) BroadcastAsync(t *tensor.Tensor, root int) Handle {
	const name = "broadcast"
	if err := checkTensors(t); err != nil {
		return g.reject(name, err)
	}
	if err := checkRoot(root, len(g.ranks)); err != nil {
		return g.reject(name, err)
	}
	dt, buf := t.DType(), bytesOf(t)
	fp := fingerprint{Op: name, Count: int64(t.Numel()), DType: dt.String(), Extra: fmt.Sprintf("root %d", root)}
	return g.submitColl(name, opBroadcast, fp, func(c *opCtx) error {
		return broadcast(c, dt, buf, root)
	})
}

func (g *group) Reduce(t *tensor.Tensor, root int, op ReduceOp) error {
	return g.ReduceAsync(t, root, op).Wait()
}

func (g *group) ReduceAsync(t *tensor.Tensor, root int, op ReduceOp) Handle {
	const name = "reduce"
	if err := checkReduceArgs(t, op); err != nil {
		return g.reject(name, err)
	}
	if err := checkRoot(root, len(g.ranks)); err != nil {
		return g.reject(name, err)
	}
	dt, buf := t.DType(), bytesOf(t)
	fp := fingerprint{Op: name, Count: int64(t.Numel()), DType: dt.String(), Reduce: op.String(), Extra: fmt.Sprintf("root %d", root)}
	return g.submitColl(name, opReduce, fp, func(c *opCtx) error {
		return reduce(c, dt, op, buf, root)
	})
}

func (g *group) Barrier() error {
	const name = "barrier"
	return g.submitColl(name, opBarrier, fingerprint{Op: name, DType: tensor.Int32.String()}, barrier).Wait()
}

func (g *group) Send(t *tensor.Tensor, to int) error { return g.SendAsync(t, to).Wait() }

func (g *group) SendAsync(t *tensor.Tensor, to int) Handle {
	name := "send"
	if err := checkPeerArgs(t, to, g.me, len(g.ranks)); err != nil {
		return g.reject(name, err)
	}
	name = fmt.Sprintf("send to rank %d", g.ranks[to])
	dt, buf := t.DType(), bytesOf(t)
	return g.submitP2P(name, opP2P, to, true, func(c *opCtx) error {
		return c.sendMsg(chP2P, to, 0, dt, buf)
	})
}

func (g *group) Recv(t *tensor.Tensor, from int) error { return g.RecvAsync(t, from).Wait() }

func (g *group) RecvAsync(t *tensor.Tensor, from int) Handle {
	name := "recv"
	if err := checkPeerArgs(t, from, g.me, len(g.ranks)); err != nil {
		return g.reject(name, err)
	}
	name = fmt.Sprintf("recv from rank %d", g.ranks[from])
	dt, buf := t.DType(), bytesOf(t)
	return g.submitP2P(name, opP2P, from, false, func(c *opCtx) error {
		return c.recvInto(from, 0, dt, buf)
	})
}
