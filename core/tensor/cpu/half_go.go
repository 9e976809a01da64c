//go:build !cgo || purego

package cpu

// Without cgo the fp16 conversions and the exactness checks are the Go
// loops of half.go.

const f16c = false

func f16FromF32s(dst []uint16, src []float32) { f16FromF32sGo(dst, src) }
func f16ToF32s(dst []float32, src []uint16)   { f16ToF32sGo(dst, src) }
func roundF16To(dst, src []float32)           { roundF16ToGo(dst, src) }
func roundBF16To(dst, src []float32)          { roundBF16ToGo(dst, src) }
func f16Exact(x []float32) bool               { return f16ExactGo(x) }
func bf16Exact(x []float32) bool              { return bf16ExactGo(x) }
