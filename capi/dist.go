package main

import (
	"fmt"
	"sync"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
)

// world is this process's world group, created from the launcher's
// environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) on first use.
// Without a launcher it is a world of one that needs no network. Every
// operation on it has comm.timeout's deadline (see worldOptions). The mutex
// also serialises collectives, which every rank must issue in the same
// order anyway.
var world struct {
	sync.Mutex
	g comm.Group
}

// worldGroup returns the world group, joining it on first use; the caller
// holds world's lock.
func worldGroup() (comm.Group, error) {
	if world.g != nil {
		return world.g, nil
	}
	opts, err := worldOptions()
	if err != nil {
		return nil, err
	}
	return joinWorld(opts)
}

// joinWorld joins the world group with opts; the caller holds world's
// lock and world.g is nil.
func joinWorld(opts comm.Options) (comm.Group, error) {
	g, err := comm.InitFromEnv(opts)
	if err != nil {
		return nil, wrap(errComm, fmt.Errorf("joining the world group (check RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT or start the program with `tinyacc launch`): %w", err))
	}
	world.g = g
	return g, nil
}

// withWorld runs fn on the world group under its lock.
func withWorld(fn func(g comm.Group) error) error {
	world.Lock()
	defer world.Unlock()
	g, err := worldGroup()
	if err != nil {
		return err
	}
	return fn(g)
}

// apiDistInit joins the world group (once) and returns rank and size.
func apiDistInit() (rank, size int, err error) {
	err = withWorld(func(g comm.Group) error {
		rank, size = g.Rank(), g.Size()
		return nil
	})
	return rank, size, err
}

// apiDistInitConfig joins the world group (once) with the deadline of the
// config h (comm.timeout), so a binding whose configuration is a document
// or a dict, not only the environment, bounds every collective and barrier
// by it. A group already joined keeps the deadline it was joined with.
func apiDistInitConfig(h int64) (rank, size int, err error) {
	c, err := get[configObj](h)
	if err != nil {
		return 0, 0, err
	}
	world.Lock()
	defer world.Unlock()
	g := world.g
	if g == nil {
		if g, err = joinWorld(comm.Options{Timeout: c.cfg.Comm.Timeout}); err != nil {
			return 0, 0, err
		}
	}
	return g.Rank(), g.Size(), nil
}

// apiDistFinalize leaves the world group; a later collective joins again.
func apiDistFinalize() error {
	world.Lock()
	defer world.Unlock()
	if world.g == nil {
		return nil
	}
	g := world.g
	world.g = nil
	scratches.Delete(g)
	return wrap(errComm, g.Close())
}

// apiCommSentBytes is the payload bytes this rank has sent on the world
// group and on every group made from it (the bucket reducer's, the started
// collectives') since it joined, as comm.ByteCounter counts them, so a
// binding can hold its communication to a formula.
func apiCommSentBytes() (n int64, err error) {
	err = withWorld(func(g comm.Group) error {
		bc, ok := g.(comm.ByteCounter)
		if !ok {
			return fail(errUnsupported, "the world group's backend does not count the bytes it sends")
		}
		n = bc.RankSentBytes()
		return nil
	})
	return n, err
}

// reduceOp maps TINYACC_SUM/AVG/MAX/MIN to comm's operations.
func reduceOp(op int) (comm.ReduceOp, error) {
	switch op {
	case 0:
		return comm.Sum, nil
	case 1:
		return comm.Avg, nil
	case 2:
		return comm.Max, nil
	case 3:
		return comm.Min, nil
	}
	return 0, fail(errInvalidArg, "reduce op %d is not one of TINYACC_SUM (0), TINYACC_AVG (1), TINYACC_MAX (2), TINYACC_MIN (3)", op)
}

// Every collective works on a Go copy of the caller's buffer and copies the
// result back, so a timed-out operation still queued in the group can never
// write into memory the caller has reused. The copies live in scratch
// buffers, one pair per group, reused from call to call (a group's
// collectives are serialised: by world's lock, or by the one goroutine
// that drives a rank in tests), so a ZeRO step's bucket-sized collectives
// allocate nothing; a failed collective drops its group's pair, as the
// group may still write into it.
type scratch struct{ in, out []float32 }

var scratches sync.Map // comm.Group -> *scratch

func scratchOf(g comm.Group) *scratch {
	s, _ := scratches.LoadOrStore(g, &scratch{})
	return s.(*scratch)
}

// take returns (*buf)[:n], growing *buf when it is shorter.
func take(buf *[]float32, n int) []float32 {
	if cap(*buf) < n {
		*buf = make([]float32, n)
	}
	return (*buf)[:n]
}

// copyIn returns the group's input scratch holding a copy of b.
func copyIn(g comm.Group, b []float32) []float32 {
	s := take(&scratchOf(g).in, len(b))
	copy(s, b)
	return s
}

// outOf returns the group's output scratch of n elements.
func outOf(g comm.Group, n int) []float32 { return take(&scratchOf(g).out, n) }

// failed drops the group's scratch after a failed collective and wraps err.
func failed(g comm.Group, err error) error {
	scratches.Delete(g)
	return wrap(errComm, err)
}

// allReduce reduces buf over the ranks of g, in place.
func allReduce(g comm.Group, buf []float32, op int) error {
	rop, err := reduceOp(op)
	if err != nil {
		return err
	}
	t := tensor.FromF32(copyIn(g, buf), len(buf))
	if err := g.AllReduce(t, rop); err != nil {
		return failed(g, err)
	}
	copy(buf, t.F32())
	return nil
}

// allGather concatenates every rank's in into out (size × len(in)).
func allGather(g comm.Group, in, out []float32) error {
	if len(out) != g.Size()*len(in) {
		return fail(errSize, "all_gather: output holds %d elements but world size %d x input %d = %d", len(out), g.Size(), len(in), g.Size()*len(in))
	}
	src := tensor.FromF32(copyIn(g, in), len(in))
	dst := tensor.FromF32(outOf(g, len(out)), len(out))
	if err := g.AllGather(src, dst); err != nil {
		return failed(g, err)
	}
	copy(out, dst.F32())
	return nil
}

// reduceScatter reduces in (size × len(out)) over the ranks and leaves this
// rank's block in out.
func reduceScatter(g comm.Group, in, out []float32, op int) error {
	rop, err := reduceOp(op)
	if err != nil {
		return err
	}
	if len(in) != g.Size()*len(out) {
		return fail(errSize, "reduce_scatter: input holds %d elements but world size %d x output %d = %d", len(in), g.Size(), len(out), g.Size()*len(out))
	}
	src := tensor.FromF32(copyIn(g, in), len(in))
	dst := tensor.FromF32(outOf(g, len(out)), len(out))
	if err := g.ReduceScatter(src, dst, rop); err != nil {
		return failed(g, err)
	}
	copy(out, dst.F32())
	return nil
}

// reduceDTypeOf maps a reduce dtype name (ddp.reduce_dtype's values) to
// the dtype the wire carries.
func reduceDTypeOf(name string) (tensor.DType, error) {
	switch name {
	case "fp32":
		return tensor.Float32, nil
	case "bf16":
		return tensor.BFloat16, nil
	}
	return 0, fail(errInvalidArg, "reduce_scatter_as: %q is not a reduce dtype: use fp32 or bf16 (ddp.reduce_dtype)", name)
}

// reduceScatterAs is reduceScatter with the wire in dtype dt: under
// BFloat16 in is rounded to bf16, the ranks' blocks are summed in float32
// and rounded once (comm's half-precision rule), and out receives this
// rank's bf16 block widened to float32: half the bytes of a float32
// reduce-scatter, as ZeRO's own bf16 reductions send.
func reduceScatterAs(g comm.Group, in, out []float32, op int, dt tensor.DType) error {
	if dt == tensor.Float32 {
		return reduceScatter(g, in, out, op)
	}
	rop, err := reduceOp(op)
	if err != nil {
		return err
	}
	if len(in) != g.Size()*len(out) {
		return fail(errSize, "reduce_scatter: input holds %d elements but world size %d x output %d = %d", len(in), g.Size(), len(out), g.Size()*len(out))
	}
	wire := make([]uint16, len(in)+len(out))
	src, dst := wire[:len(in)], wire[len(in):]
	cpu.BF16FromF32s(src, in)
	if err := g.ReduceScatter(tensor.FromBF16(src, len(src)), tensor.FromBF16(dst, len(dst)), rop); err != nil {
		return wrap(errComm, err)
	}
	cpu.BF16ToF32s(out, dst)
	return nil
}

// broadcast copies root's buf into buf on every rank.
func broadcast(g comm.Group, buf []float32, root int) error {
	if root < 0 || root >= g.Size() {
		return fail(errInvalidArg, "broadcast: root %d is outside the world of %d ranks", root, g.Size())
	}
	t := tensor.FromF32(copyIn(g, buf), len(buf))
	if err := g.Broadcast(t, root); err != nil {
		return failed(g, err)
	}
	copy(buf, t.F32())
	return nil
}

// barrier returns once every rank of g has entered it.
func barrier(g comm.Group) error { return wrap(errComm, g.Barrier()) }
