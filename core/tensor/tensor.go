// Package tensor holds tinyacc's dense tensors, the memory accounting behind
// them, and the reverse-mode autograd that records operations on them.
//
// A Tensor is a row-major block of numbers with a dtype, a shape and the
// Device it lives on. Every buffer comes from the Allocator with a Category
// (params, grads, optimizer state, activations, comm) so each rank can report
// how much memory goes where.
package tensor

import (
	"fmt"
	"strings"

	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
)

// DType is the element type of a tensor.
type DType int

const (
	Float32 DType = iota
	Float64
	Int32
	BFloat16 // a compute dtype under mixed precision (precision.go): parameters' half copies, and what half-width communication carries
	Float16  // IEEE binary16, likewise
)

// Size is the number of bytes of one element.
func (d DType) Size() int {
	switch d {
	case Float32, Int32:
		return 4
	case Float64:
		return 8
	case BFloat16, Float16:
		return 2
	}
	panic(fmt.Sprintf("tensor: unknown dtype %d", int(d)))
}

func (d DType) String() string {
	switch d {
	case Float32:
		return "float32"
	case Float64:
		return "float64"
	case Int32:
		return "int32"
	case BFloat16:
		return "bfloat16"
	case Float16:
		return "float16"
	}
	return fmt.Sprintf("dtype(%d)", int(d))
}

// Device says where a tensor's storage lives. Only the CPU exists today, and
// the ops of this package run CPU kernels (dispatching on the dtype); the
// field is where a second device would be recorded.
type Device interface {
	Name() string
}

type cpuDevice struct{}

func (cpuDevice) Name() string { return "cpu" }

// CPU is the host device.
var CPU Device = cpuDevice{}

// Tensor is a dense row-major array. Exactly one of the typed slices is set,
// according to dtype. The autograd fields are nil for tensors that do not take
// part in a graph.
type Tensor struct {
	shape []int
	dtype DType
	dev   Device
	cat   Category
	alloc *Allocator // owner of the storage; nil for views and wrapped memory
	// home is the allocator of the rank the tensor belongs to; ops
	// allocate their outputs there, even when the storage is a view or an
	// alias into a flat buffer.
	home *Allocator

	f32 []float32
	f64 []float64
	i32 []int32
	u16 []uint16 // BFloat16 and Float16: the numbers' 16-bit patterns

	// acct is the category the allocator counts the storage in: cat,
	// except for float32 parameters under mixed precision, the masters,
	// counted with the optimizer state (precision.go).
	acct Category
	// half is the half-precision copy a parameter's matrix products read
	// under mixed precision (precision.go); nil until one reads it and
	// after the master changes.
	half *Tensor
	// early is the 2-byte copy of an activation's float32 values made as
	// an op wrote or read them (early.go), which a Linear's forward product
	// reads where it is stored (halfInput) and StoreHalf takes instead of
	// rounding them again; nil when there is none.
	early *Tensor

	// Name is the parameter's global name (Hugging Face GPT-2 naming) for
	// parameters, empty otherwise.
	Name string
	// Spec says which part of the global parameter this tensor is (nil
	// for tensors that are not parameters).
	Spec *place.Spec
	// Grad holds the accumulated gradient of a leaf that requires grad.
	Grad *Tensor

	requiresGrad bool
	node         *node // the op that produced this tensor; nil for leaves

	// Selective recomputation (recompute.go): dropped is set while an
	// activation's storage is given back, refilled once the backward has
	// formed it again; base is the activation a view shares storage
	// with, views are an activation's views, re-pointed when its storage
	// comes back.
	dropped  bool
	refilled bool // formed again by the backward, given back after its producer's
	base     *Tensor
	views    []*Tensor
}

// Numel is the number of elements of shape.
func Numel(shape []int) int {
	n := 1
	for _, s := range shape {
		n *= s
	}
	return n
}

// New allocates a zeroed tensor on the CPU, accounted as activations by the
// default allocator.
func New(dtype DType, shape ...int) *Tensor {
	return Default.New(Activations, dtype, shape...)
}

// FromF32 wraps data (not copied) in a float32 tensor of the given shape.
// The buffer is not accounted: it belongs to the caller.
func FromF32(data []float32, shape ...int) *Tensor {
	mustMatch(len(data), shape)
	return &Tensor{shape: clone(shape), dtype: Float32, dev: CPU, f32: data, cat: Other}
}

// FromF64 wraps data (not copied) in a float64 tensor.
func FromF64(data []float64, shape ...int) *Tensor {
	mustMatch(len(data), shape)
	return &Tensor{shape: clone(shape), dtype: Float64, dev: CPU, f64: data, cat: Other}
}

// FromI32 wraps data (not copied) in an int32 tensor.
func FromI32(data []int32, shape ...int) *Tensor {
	mustMatch(len(data), shape)
	return &Tensor{shape: clone(shape), dtype: Int32, dev: CPU, i32: data, cat: Other}
}

// FromBF16 wraps data (not copied), bfloat16 bit patterns, in a bfloat16
// tensor.
func FromBF16(data []uint16, shape ...int) *Tensor {
	mustMatch(len(data), shape)
	return &Tensor{shape: clone(shape), dtype: BFloat16, dev: CPU, u16: data, cat: Other}
}

// FromF16 wraps data (not copied), IEEE binary16 bit patterns, in a float16
// tensor.
func FromF16(data []uint16, shape ...int) *Tensor {
	mustMatch(len(data), shape)
	return &Tensor{shape: clone(shape), dtype: Float16, dev: CPU, u16: data, cat: Other}
}

func mustMatch(n int, shape []int) {
	if Numel(shape) != n {
		panic(fmt.Sprintf("tensor: %d elements do not fit shape %v", n, shape))
	}
}

func clone(s []int) []int { return append([]int(nil), s...) }

// Shape returns the tensor's shape; callers must not modify it.
func (t *Tensor) Shape() []int { return t.shape }

// Dim returns the size of dimension i (negative i counts from the end).
func (t *Tensor) Dim(i int) int {
	if i < 0 {
		i += len(t.shape)
	}
	return t.shape[i]
}

// Numel is the number of elements.
func (t *Tensor) Numel() int { return Numel(t.shape) }

// Bytes is the size of the storage in bytes.
func (t *Tensor) Bytes() int64 { return int64(t.Numel()) * int64(t.dtype.Size()) }

// DType returns the element type.
func (t *Tensor) DType() DType { return t.dtype }

// Device returns where the storage lives.
func (t *Tensor) Device() Device { return t.dev }

// Category is the accounting category of the storage.
func (t *Tensor) Category() Category { return t.cat }

// F32 returns the float32 storage; it panics for other dtypes.
func (t *Tensor) F32() []float32 {
	s := t.f32s()
	t.dropEarly() // the caller may write them (early.go)
	return s
}

// f32s is F32 for the package's ops, which write only their own outputs:
// it leaves a copy made as the values were written (early.go) alone.
func (t *Tensor) f32s() []float32 {
	if t.dtype != Float32 {
		panic("tensor: F32 on a " + t.dtype.String() + " tensor")
	}
	return t.f32
}

// F64 returns the float64 storage; it panics for other dtypes.
func (t *Tensor) F64() []float64 {
	if t.dtype != Float64 {
		panic("tensor: F64 on a " + t.dtype.String() + " tensor")
	}
	return t.f64
}

// I32 returns the int32 storage; it panics for other dtypes.
func (t *Tensor) I32() []int32 {
	if t.dtype != Int32 {
		panic("tensor: I32 on a " + t.dtype.String() + " tensor")
	}
	return t.i32
}

// U16 returns the bit patterns of a bfloat16 or float16 tensor; it panics
// for other dtypes.
func (t *Tensor) U16() []uint16 {
	if t.dtype != BFloat16 && t.dtype != Float16 {
		panic("tensor: U16 on a " + t.dtype.String() + " tensor")
	}
	return t.u16
}

// At returns element i (flat index) as a float64, whatever the dtype.
func (t *Tensor) At(i int) float64 {
	switch t.dtype {
	case Float32:
		return float64(t.f32[i])
	case Float64:
		return t.f64[i]
	case Int32:
		return float64(t.i32[i])
	case BFloat16:
		return float64(cpu.BF16ToF32(t.u16[i]))
	case Float16:
		return float64(cpu.F16ToF32(t.u16[i]))
	}
	panic("tensor: At on " + t.dtype.String())
}

// Set stores v at flat index i, converting to the tensor's dtype.
func (t *Tensor) Set(i int, v float64) {
	t.dropEarly()
	switch t.dtype {
	case Float32:
		t.f32[i] = float32(v)
	case Float64:
		t.f64[i] = v
	case Int32:
		t.i32[i] = int32(v)
	case BFloat16:
		t.u16[i] = cpu.BF16FromF32(float32(v))
	case Float16:
		t.u16[i] = cpu.F16FromF32(float32(v))
	default:
		panic("tensor: Set on " + t.dtype.String())
	}
}

// Float64s returns a copy of the elements as float64.
func (t *Tensor) Float64s() []float64 {
	out := make([]float64, t.Numel())
	for i := range out {
		out[i] = t.At(i)
	}
	return out
}

// Reshape returns a tensor sharing storage with t with a new shape of the
// same size. It is not recorded by autograd; use View for that.
func (t *Tensor) Reshape(shape ...int) *Tensor {
	mustMatch(t.Numel(), shape)
	c := *t
	c.shape = clone(shape)
	c.Spec = nil
	c.node = nil
	c.requiresGrad = false
	c.Grad = nil
	c.alloc = nil // a view does not own the storage
	c.views, c.dropped, c.refilled = nil, false, false
	c.half, c.early = nil, nil
	if t.cat == Activations {
		b := t.base
		if b == nil {
			b = t
		}
		c.base = b
		b.views = append(b.views, &c)
	}
	return &c
}

// Span returns elements [lo, hi) of t's storage, in t's dtype and without
// copying, as a tensor of the given shape (one dimension of hi-lo when
// none is given). Like FromF32 on a slice, the view is not accounted and
// not recorded by autograd; flat-buffer strategies (gradient buckets,
// shards) use it whatever dtype the model trains in.
func (t *Tensor) Span(lo, hi int, shape ...int) *Tensor {
	if len(shape) == 0 {
		shape = []int{hi - lo}
	}
	switch t.dtype {
	case Float32:
		return FromF32(t.f32[lo:hi:hi], shape...)
	case Float64:
		return FromF64(t.f64[lo:hi:hi], shape...)
	case Int32:
		return FromI32(t.i32[lo:hi:hi], shape...)
	case BFloat16:
		return FromBF16(t.u16[lo:hi:hi], shape...)
	case Float16:
		return FromF16(t.u16[lo:hi:hi], shape...)
	}
	panic(fmt.Sprintf("tensor: Span of %s", t))
}

// CopyFrom copies src's elements into t (same numel, same dtype).
func (t *Tensor) CopyFrom(src *Tensor) {
	if src.Numel() != t.Numel() || src.dtype != t.dtype {
		panic(fmt.Sprintf("tensor: CopyFrom %s%v into %s%v", src.dtype, src.shape, t.dtype, t.shape))
	}
	t.dropEarly()
	switch t.dtype {
	case Float32:
		copy(t.f32, src.f32)
	case Float64:
		copy(t.f64, src.f64)
	case Int32:
		copy(t.i32, src.i32)
	case BFloat16, Float16:
		copy(t.u16, src.u16)
	}
}

// Clone returns a deep copy in category cat, without autograd history.
func (t *Tensor) Clone(cat Category) *Tensor {
	c := Default.New(cat, t.dtype, t.shape...)
	c.CopyFrom(t)
	c.Name = t.Name
	return c
}

// Zero sets every element to zero.
func (t *Tensor) Zero() {
	t.dropEarly()
	switch t.dtype {
	case BFloat16, Float16:
		cpu.Clear(t.u16)
	case Float32:
		cpu.Clear(t.f32)
	case Float64:
		cpu.Clear(t.f64)
	case Int32:
		cpu.Clear(t.i32)
	}
}

// Scalar returns the single element of a one-element tensor.
func (t *Tensor) Scalar() float64 {
	if t.Numel() != 1 {
		panic(fmt.Sprintf("tensor: Scalar on shape %v", t.shape))
	}
	return t.At(0)
}

func (t *Tensor) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Tensor(%s %v", t.dtype, t.shape)
	if t.Name != "" {
		fmt.Fprintf(&b, " %q", t.Name)
	}
	b.WriteString(")")
	return b.String()
}

// Alias makes t's elements the t.Numel() elements of flat starting at
// offset, without copying; t's own storage is released. Sharded strategies
// lay parameters and gradients out in flat buffers this way while the model
// keeps referring to the same *Tensor. Copy the values in (CopyFrom) after
// aliasing if flat does not hold them yet.
func (t *Tensor) Alias(flat *Tensor, offset int) {
	if flat.dtype != t.dtype || offset < 0 || offset+t.Numel() > flat.Numel() {
		panic(fmt.Sprintf("tensor: cannot alias %s to %d elements at %d of %s", t, t.Numel(), offset, flat))
	}
	t.Release()
	t.dropHalf()
	n := t.Numel()
	switch t.dtype {
	case Float32:
		t.f32 = flat.f32[offset : offset+n : offset+n]
	case Float64:
		t.f64 = flat.f64[offset : offset+n : offset+n]
	case Int32:
		t.i32 = flat.i32[offset : offset+n : offset+n]
	case BFloat16, Float16:
		t.u16 = flat.u16[offset : offset+n : offset+n]
	}
	t.cat = flat.cat
}

// DropStorage leaves t without elements until the next Alias (ZeRO-3 frees
// a parameter between uses); any use of its data in between panics.
func (t *Tensor) DropStorage() {
	t.Release()
	t.dropHalf()
	t.f32, t.f64, t.i32, t.u16 = nil, nil, nil, nil
}

// HasStorage reports whether t currently holds elements.
func (t *Tensor) HasStorage() bool {
	return t.f32 != nil || t.f64 != nil || t.i32 != nil || t.u16 != nil || t.Numel() == 0
}
