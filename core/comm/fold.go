package comm

import (
	"unsafe"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// Folding many ranks' copies of a block into one, as the shared-memory
// collectives do: dst = s0 op s1 op ... op s(n-1), elementwise, in source
// order, so the result is bitwise the same on every rank and every run, and
// the same as the tcp backend's direct algorithm (which folds in rank order
// too). Sums run in C where cgo is available (fold_cgo.go), the rest here.

// foldTile is how many bytes of the sources are folded at a time: a tile of
// the accumulator stays in the first-level cache while every source passes
// over it, so memory sees n reads and one write per element.
const foldTile = 8 << 10

// srcs are a fold's sources: source k at base+k*stride, except that
// source own, when mine is not nil, is mine. A rank folds its own part of a
// block from its buffer, where it is, so it never copies that part into
// the segment: nobody else reads it.
type srcs struct {
	base   unsafe.Pointer
	stride int
	n      int
	own    int
	mine   []byte
}

// at is source k, bytes [off, off+n).
func (ss srcs) at(k, off, n int) []byte {
	if k == ss.own && ss.mine != nil {
		return ss.mine[off : off+n]
	}
	return src(ss.base, ss.stride, k, off, n)
}

// src is source k of sources k*stride bytes apart from base, bytes [off, off+n).
func src(base unsafe.Pointer, stride, k, off, n int) []byte {
	return unsafe.Slice((*byte)(unsafe.Add(base, k*stride+off)), n)
}

// fold sets dst to the reduction of the sources, each len(dst) bytes. dst
// may be one of the sources.
func fold(dt tensor.DType, op ReduceOp, dst []byte, ss srcs, acc []byte) {
	if len(dst) == 0 {
		return
	}
	if ss.n == 1 {
		copy(dst, ss.at(0, 0, len(dst)))
		return
	}
	if op == Sum || op == Avg {
		foldSum(dt, dst, ss)
		return
	}
	foldGo(dt, op, dst, ss, acc)
}

// foldGo is fold in Go, tile by tile through acc (at least foldTile bytes).
func foldGo(dt tensor.DType, op ReduceOp, dst []byte, ss srcs, acc []byte) {
	for off := 0; off < len(dst); off += foldTile {
		m := min(foldTile, len(dst)-off)
		a := acc[:m]
		reduceBytes(dt, op, a, ss.at(0, off, m), ss.at(1, off, m))
		for k := 2; k < ss.n; k++ {
			reduceBytes(dt, op, a, a, ss.at(k, off, m))
		}
		copy(dst[off:off+m], a)
	}
}

// foldSumGo is the sum of fold in Go, for short folds and builds without cgo.
func foldSumGo(dt tensor.DType, dst []byte, ss srcs) {
	var acc [foldTile]byte
	foldGo(dt, Sum, dst, ss, acc[:])
}
