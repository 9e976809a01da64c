package comm

import (
	"unsafe"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// Half-precision collectives (bfloat16 and float16 tensors). Gathers,
// broadcasts, all-to-all and point-to-point move the 16-bit patterns like
// any other bytes. Reductions follow one rule on every backend:
//
//	every rank's element is widened to float32 (exactly), the elements
//	are summed in float32 in rank order (0, 1, ..., n-1), an average is
//	that sum divided by the group size in float32, and the result is
//	rounded to the half dtype once, to nearest even.
//
// So a sum of half-precision gradients loses nothing to rounding between
// ranks, unlike a ring whose partial sums would be rounded at every hop,
// and the result is bitwise the same on every rank and every backend.
//
// On the local and tcp backends (with or without a shared-memory segment,
// on one host or spread over several) the data still travels in half
// precision: a reduction is an all-to-all that hands rank p block p of
// every rank's tensor, each rank folds its block in float32 and rounds it
// once, and an all-gather of the rounded blocks completes an all-reduce.
// That moves 2(N-1)/N of the tensor's bytes per rank, what a ring
// all-reduce moves, and half of what the float32 tensor would; a
// reduce-scatter moves (N-1)/N. The mpi backend widens to float32, lets
// MPI sum and rounds once (mpi_group.go): the same rule, float32 bytes.

func isHalf(dt tensor.DType) bool { return dt == tensor.BFloat16 || dt == tensor.Float16 }

func u16s(b []byte) []uint16 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&b[0])), len(b)/2)
}

// foldHalfGo is foldHalf in Go: per tile, the sources widened and combined
// in float32 in source order, divided by nsrc for Avg, rounded once.
func foldHalfGo(dt tensor.DType, op ReduceOp, dst []byte, base unsafe.Pointer, stride, nsrc int) {
	const tile = foldTile / 4
	var acc, w [tile]float32
	out := u16s(dst)
	for i0 := 0; i0 < len(out); i0 += tile {
		m := min(tile, len(out)-i0)
		a := acc[:m]
		for k := 0; k < nsrc; k++ {
			s := u16s(src(base, stride, k, 2*i0, 2*m))
			if k == 0 {
				tensor.WidenHalf(dt, a, s)
				continue
			}
			tensor.WidenHalf(dt, w[:m], s)
			combine(op, a, a, w[:m])
		}
		if op == Avg {
			n := float32(nsrc)
			for i := range a {
				a[i] /= n
			}
		}
		tensor.NarrowHalf(dt, out[i0:i0+m], a)
	}
}

// halfScratch is a per-group buffer of n bytes for the blocks a half
// reduction receives, apart from scratchBuf, which the algorithms it
// calls may use.
func (g *group) halfScratch(n int) []byte {
	if cap(g.half) < n {
		g.half = make([]byte, n)
	}
	return g.half[:n]
}

// reduceHalf reduces the half tensor buf (cut into the group's blocks) by
// the rule above and leaves the result in buf: on every rank when all is
// set, else in this rank's own block only (the rest of buf unchanged).
// Blocks are splitBlocks' cut, so every rank folds about 1/N.
func reduceHalf(c *opCtx, dt tensor.DType, op ReduceOp, buf []byte, all bool) error {
	n, me := c.size(), c.me()
	off := splitBlocks(len(buf)/2, n, 2)
	bs := off[me+1] - off[me]
	got := c.g.halfScratch(n * bs)
	recvOff := make([]int, n+1)
	for r := range recvOff {
		recvOff[r] = r * bs
	}
	if err := allToAllV(c, dt, buf, got, off, recvOff, true); err != nil {
		return err
	}
	mine := buf[off[me]:off[me+1]]
	if bs > 0 {
		foldHalf(dt, op, mine, unsafe.Pointer(&got[0]), bs, n)
	}
	if !all {
		return nil
	}
	return allGatherV(c, dt, mine, buf, off)
}

// reduceScatterHalf leaves block me of the reduction of in (n blocks of
// len(out) bytes) in out, by the rule above.
func reduceScatterHalf(c *opCtx, dt tensor.DType, op ReduceOp, in, out []byte) error {
	n, bs := c.size(), len(out)
	off := make([]int, n+1)
	for r := range off {
		off[r] = r * bs
	}
	got := c.g.halfScratch(n * bs)
	if err := allToAllV(c, dt, in, got, off, off, false); err != nil {
		return err
	}
	if bs > 0 {
		foldHalf(dt, op, out, unsafe.Pointer(&got[0]), bs, n)
	}
	return nil
}

// reduceToRoot is Reduce for half dtypes: root needs every block, so it is
// an all-reduce (the other ranks' buf is scratch, as Reduce allows).
func reduceToRoot(c *opCtx, dt tensor.DType, op ReduceOp, buf []byte) error {
	return reduceHalf(c, dt, op, buf, true)
}
