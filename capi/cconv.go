package main

/*
#include <stdint.h>
*/
import "C"

import (
	"unsafe"
)

// These helpers turn C arguments into Go values. Slices built here alias
// caller memory and are used only until the export returns.

// cString reads a NUL-terminated string; NULL is "" when allowed.
func cString(what string, p *C.char, nullOK bool) (string, error) {
	if p == nil {
		if nullOK {
			return "", nil
		}
		return "", fail(errInvalidArg, "%s is NULL", what)
	}
	return C.GoString(p), nil
}

// checkCount validates a pointer + element count pair.
func checkCount(what string, p unsafe.Pointer, n C.int64_t) (int, error) {
	if n < 0 {
		return 0, fail(errInvalidArg, "%s: count %d is negative", what, int64(n))
	}
	if n > 0 && p == nil {
		return 0, fail(errInvalidArg, "%s is NULL but its count is %d", what, int64(n))
	}
	return int(n), nil
}

// f32s views a caller float buffer of n elements.
func f32s(what string, p *C.float, n C.int64_t) ([]float32, error) {
	k, err := checkCount(what, unsafe.Pointer(p), n)
	if err != nil || k == 0 {
		return []float32{}, err
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(p)), k), nil
}

// i32s views a caller int32 buffer of n elements.
func i32s(what string, p *C.int32_t, n C.int64_t) ([]int32, error) {
	k, err := checkCount(what, unsafe.Pointer(p), n)
	if err != nil || k == 0 {
		return []int32{}, err
	}
	return unsafe.Slice((*int32)(unsafe.Pointer(p)), k), nil
}

// outPtr checks that a required output pointer is set.
func outPtr[T any](what string, p *T) error {
	if p == nil {
		return fail(errInvalidArg, "output %s is NULL", what)
	}
	return nil
}

// putString copies s NUL-terminated into buf (capacity cap bytes) and
// stores the bytes needed, NUL included, in *need (when not NULL). A
// buffer too small leaves it untouched and fails with TINYACC_ERR_SIZE, so
// callers can ask for the size first with buf NULL and cap 0.
func putString(what string, s string, buf *C.char, cap C.int64_t, need *C.int64_t) error {
	n := int64(len(s)) + 1
	if need != nil {
		*need = C.int64_t(n)
	}
	if buf == nil && cap == 0 {
		return nil
	}
	if int64(cap) < n || buf == nil {
		return fail(errSize, "%s needs a buffer of %d bytes, got %d", what, n, int64(cap))
	}
	dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), n)
	copy(dst, s)
	dst[n-1] = 0
	return nil
}
