//go:build !cgo || purego

package cpu

// Without cgo the fp16 conversions and the exactness checks are the Go
// loops of half.go.

const f16c = false

func f16FromF32s(dst []uint16, src []float32) { f16FromF32sGo(dst, src) }
func f16ToF32s(dst []float32, src []uint16)   { f16ToF32sGo(dst, src) }
func roundHalf(f16 bool, dst, src []float32, rows, cols, ldd, lds int) {
	roundHalfGo(f16, dst, src, rows, cols, ldd, lds)
}

func exactHalf(f16 bool, x []float32, rows, cols, ld int) bool {
	return exactHalfGo(f16, x, rows, cols, ld)
}
