//go:build cgo && !purego

package cpu

/*
#cgo CFLAGS: -O3
#include "half_f16c.h"
*/
import "C"

import "unsafe"

// f16c says the CPU has F16C and AVX2, so the fp16 conversions run the
// loops of half_f16c.c; checked once at start. Slices shorter than convC
// stay in Go, where the cgo transition would cost more than the loop.
var f16c = C.tacc_f16c_supported() != 0

func f16FromF32s(dst []uint16, src []float32) {
	if !f16c || len(src) < convC {
		f16FromF32sGo(dst, src)
		return
	}
	_ = dst[len(src)-1]
	C.tacc_f16_from_f32((*C.uint32_t)(unsafe.Pointer(&src[0])), (*C.uint16_t)(&dst[0]), C.long(len(src)))
}

func f16ToF32s(dst []float32, src []uint16) {
	if !f16c || len(src) < convC {
		f16ToF32sGo(dst, src)
		return
	}
	_ = dst[len(src)-1]
	C.tacc_f16_to_f32((*C.uint16_t)(&src[0]), (*C.uint32_t)(unsafe.Pointer(&dst[0])), C.long(len(src)))
}

func roundF16To(dst, src []float32) {
	if !f16c || len(src) < convC {
		roundF16ToGo(dst, src)
		return
	}
	_ = dst[len(src)-1]
	C.tacc_round_f16((*C.uint32_t)(unsafe.Pointer(&src[0])), (*C.uint32_t)(unsafe.Pointer(&dst[0])), C.long(len(src)))
}

func roundBF16To(dst, src []float32) {
	if len(src) < convC {
		roundBF16ToGo(dst, src)
		return
	}
	_ = dst[len(src)-1]
	C.tacc_round_bf16_to((*C.uint32_t)(unsafe.Pointer(&src[0])), (*C.uint32_t)(unsafe.Pointer(&dst[0])), C.long(len(src)))
}

func f16Exact(x []float32) bool {
	if !f16c || len(x) < convC {
		return f16ExactGo(x)
	}
	return C.tacc_f16_exact((*C.uint32_t)(unsafe.Pointer(&x[0])), C.long(len(x))) != 0
}

func bf16Exact(x []float32) bool {
	if len(x) < convC {
		return bf16ExactGo(x)
	}
	return C.tacc_bf16_exact((*C.uint32_t)(unsafe.Pointer(&x[0])), C.long(len(x))) != 0
}
