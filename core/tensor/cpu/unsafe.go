package cpu

import "unsafe"

// isF32 reports whether T is a 4-byte float (float32 or a type defined on
// it); kernels use it to pick their specialised float32 loops.
func isF32[T Float]() bool {
	var z T
	return unsafe.Sizeof(z) == 4
}

// as32 views a slice of a 4-byte Float type as []float32 without copying.
// Callers check isF32 first.
func as32[T Float](x []T) []float32 {
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(x))), len(x))
}

// as64 views a slice of an 8-byte Float type as []float64 without copying.
func as64[T Float](x []T) []float64 {
	return unsafe.Slice((*float64)(unsafe.Pointer(unsafe.SliceData(x))), len(x))
}
