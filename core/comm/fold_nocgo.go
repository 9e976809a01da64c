//go:build !cgo

package comm

import (
	"unsafe"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// foldSum sets dst to the sum of nsrc equally long sources, source k at
// base[k*stride:], added in source order (fold.go; without cgo, in Go).
func foldSum(dt tensor.DType, dst []byte, ss srcs) {
	foldSumGo(dt, dst, ss)
}

// foldHalf folds half sources by the rule of half.go (in Go without cgo).
func foldHalf(dt tensor.DType, op ReduceOp, dst []byte, base unsafe.Pointer, stride, nsrc int) {
	foldHalfGo(dt, op, dst, base, stride, nsrc)
}

// copyNT copies src into dst (in Go without cgo).
func copyNT(dst, src []byte) { copy(dst, src) }
