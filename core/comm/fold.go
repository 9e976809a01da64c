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

// fold sets dst to the reduction of nsrc sources of len(dst) bytes, source
// k at base+k*stride. dst may be one of the sources.
func fold(dt tensor.DType, op ReduceOp, dst []byte, base unsafe.Pointer, stride, nsrc int, acc []byte) {
	if len(dst) == 0 {
		return
	}
	if nsrc == 1 {
		copy(dst, unsafe.Slice((*byte)(base), len(dst)))
		return
	}
	if op == Sum || op == Avg {
		foldSum(dt, dst, base, stride, nsrc)
		return
	}
	foldGo(dt, op, dst, base, stride, nsrc, acc)
}

// src is source k of a fold, bytes [off, off+n).
func src(base unsafe.Pointer, stride, k, off, n int) []byte {
	return unsafe.Slice((*byte)(unsafe.Add(base, k*stride+off)), n)
}

// foldGo is fold in Go, tile by tile through acc (at least foldTile bytes).
func foldGo(dt tensor.DType, op ReduceOp, dst []byte, base unsafe.Pointer, stride, nsrc int, acc []byte) {
	for off := 0; off < len(dst); off += foldTile {
		m := min(foldTile, len(dst)-off)
		a := acc[:m]
		reduceBytes(dt, op, a, src(base, stride, 0, off, m), src(base, stride, 1, off, m))
		for k := 2; k < nsrc; k++ {
			reduceBytes(dt, op, a, a, src(base, stride, k, off, m))
		}
		copy(dst[off:off+m], a)
	}
}

// foldSumGo is the sum of fold in Go, for short folds and builds without cgo.
func foldSumGo(dt tensor.DType, dst []byte, base unsafe.Pointer, stride, nsrc int) {
	var acc [foldTile]byte
	foldGo(dt, Sum, dst, base, stride, nsrc, acc[:])
}
