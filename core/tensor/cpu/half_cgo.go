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

func roundHalf(f16 bool, dst, src []float32, rows, cols, ldd, lds int) {
	if rows == 0 || cols == 0 {
		return
	}
	if f16 && !f16c || rows*cols < convC {
		roundHalfGo(f16, dst, src, rows, cols, ldd, lds)
		return
	}
	_, _ = src[(rows-1)*lds+cols-1], dst[(rows-1)*ldd+cols-1]
	s, d := (*C.uint32_t)(unsafe.Pointer(&src[0])), (*C.uint32_t)(unsafe.Pointer(&dst[0]))
	if f16 {
		C.tacc_round_f16_2d(s, d, C.long(rows), C.long(cols), C.long(lds), C.long(ldd))
	} else {
		C.tacc_round_bf16_2d(s, d, C.long(rows), C.long(cols), C.long(lds), C.long(ldd))
	}
}

func exactHalf(f16 bool, x []float32, rows, cols, ld int) bool {
	if rows == 0 || cols == 0 {
		return true
	}
	if f16 && !f16c || rows*cols < convC {
		return exactHalfGo(f16, x, rows, cols, ld)
	}
	_ = x[(rows-1)*ld+cols-1]
	p := (*C.uint32_t)(unsafe.Pointer(&x[0]))
	if f16 {
		return C.tacc_f16_exact_2d(p, C.long(rows), C.long(cols), C.long(ld)) != 0
	}
	return C.tacc_bf16_exact_2d(p, C.long(rows), C.long(cols), C.long(ld)) != 0
}
