package comm

import (
	"fmt"
	"unsafe"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// Tensors travel as their raw in-memory bytes: no per-element encoding, no
// copy into a send buffer. The wire format is therefore the host's byte
// order, which is little-endian on every platform tinyacc targets; NewTCP
// refuses to start on a big-endian host rather than exchange garbage.

func hostLittleEndian() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}

// bytesOf is a byte view of t's storage (no copy).
func bytesOf(t *tensor.Tensor) []byte {
	switch t.DType() {
	case tensor.Float32:
		s := t.F32()
		if len(s) == 0 {
			return nil
		}
		return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*4)
	case tensor.Float64:
		s := t.F64()
		if len(s) == 0 {
			return nil
		}
		return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*8)
	case tensor.Int32:
		s := t.I32()
		if len(s) == 0 {
			return nil
		}
		return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*4)
	case tensor.BFloat16, tensor.Float16:
		s := t.U16()
		if len(s) == 0 {
			return nil
		}
		return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*2)
	}
	return nil
}

func checkDType(t *tensor.Tensor) error {
	if t == nil {
		return fmt.Errorf("nil tensor")
	}
	switch t.DType() {
	case tensor.Float32, tensor.Float64, tensor.Int32, tensor.BFloat16, tensor.Float16:
	default:
		return fmt.Errorf("dtype %s is not supported (use float32, float64, int32, bfloat16 or float16)", t.DType())
	}
	if t.Device() != tensor.CPU {
		return fmt.Errorf("tensor on device %s: this backend works on CPU tensors", t.Device().Name())
	}
	return nil
}

func f32s(b []byte) []float32 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

func f64s(b []byte) []float64 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*float64)(unsafe.Pointer(&b[0])), len(b)/8)
}

func i32s(b []byte) []int32 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*int32)(unsafe.Pointer(&b[0])), len(b)/4)
}

type number interface {
	~float32 | ~float64 | ~int32
}

// combine sets dst[i] = a[i] op b[i]; dst may alias a. Avg sums here and
// divides once at the end (scale), so every rank divides the same total.
func combine[T number](op ReduceOp, dst, a, b []T) {
	a = a[:len(dst)]
	b = b[:len(dst)]
	switch op {
	case Sum, Avg:
		for i := range dst {
			dst[i] = a[i] + b[i]
		}
	case Max:
		for i := range dst {
			dst[i] = max(a[i], b[i])
		}
	case Min:
		for i := range dst {
			dst[i] = min(a[i], b[i])
		}
	}
}

// reduceBytes sets dst = a op b on byte views of dtype dt.
func reduceBytes(dt tensor.DType, op ReduceOp, dst, a, b []byte) {
	switch dt {
	case tensor.Float32:
		combine(op, f32s(dst), f32s(a), f32s(b))
	case tensor.Float64:
		combine(op, f64s(dst), f64s(a), f64s(b))
	case tensor.Int32:
		combine(op, i32s(dst), i32s(a), i32s(b))
	}
}

// scaleBytes divides every element by n (the Avg of float dtypes).
func scaleBytes(dt tensor.DType, b []byte, n int) {
	switch dt {
	case tensor.Float32:
		s := f32s(b)
		inv := float32(n)
		for i := range s {
			s[i] /= inv
		}
	case tensor.Float64:
		s := f64s(b)
		inv := float64(n)
		for i := range s {
			s[i] /= inv
		}
	}
}
