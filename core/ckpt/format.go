// Package ckpt reads and writes checkpoints in the safetensors format: an
// 8-byte little-endian header length, a JSON header naming each tensor's
// dtype, shape and byte range, then the raw little-endian data. It is the
// format Hugging Face publishes GPT-2 in, so real weights load and ours
// export, and it is simple enough to validate completely before trusting a
// single byte of data.
package ckpt

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// Limits on what Load accepts. A header beyond maxHeader is almost surely a
// corrupt length field; refusing it avoids allocating gigabytes for garbage.
const (
	maxHeader   = 100 << 20
	metadataKey = "__metadata__"
	headerAlign = 8
)

// fileDType is a dtype as spelled in a safetensors header.
type fileDType string

const (
	dtF32  fileDType = "F32"
	dtF64  fileDType = "F64"
	dtI32  fileDType = "I32"
	dtBF16 fileDType = "BF16"
	dtF16  fileDType = "F16"
)

// size is the element size in bytes; 0 for an unknown dtype.
func (d fileDType) size() int {
	switch d {
	case dtF32, dtI32:
		return 4
	case dtF64:
		return 8
	case dtBF16, dtF16:
		return 2
	}
	return 0
}

// fileDTypeOf maps a tensor dtype to the header spelling Save writes.
// Checkpoints hold float32 masters; half precision is written by exports
// in bf16 (`tinyacc export --dtype bf16`).
func fileDTypeOf(d tensor.DType) (fileDType, bool) {
	switch d {
	case tensor.Float32:
		return dtF32, true
	case tensor.Float64:
		return dtF64, true
	case tensor.Int32:
		return dtI32, true
	case tensor.BFloat16:
		return dtBF16, true
	case tensor.Float16:
		return dtF16, true
	}
	return "", false
}

// bf16ToF32 widens a bfloat16, which is the top half of a float32.
func bf16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// f16ToF32 converts an IEEE 754 half to float32 exactly (every half value is
// representable), including subnormals, infinities and NaN payloads.
func f16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	frac := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf or NaN
		return math.Float32frombits(sign | 0xff<<23 | frac<<13)
	case exp != 0: // normal: rebias 15 -> 127
		return math.Float32frombits(sign | (exp+112)<<23 | frac<<13)
	case frac == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal half: frac·2^-24, normal in float32. Shift the leading one
	// into the implicit bit position and lower the exponent accordingly.
	e := uint32(113) // exponent of 2^-14 biased for float32, minus the shifts below
	for frac&0x400 == 0 {
		frac <<= 1
		e--
	}
	return math.Float32frombits(sign | e<<23 | (frac&0x3ff)<<13)
}

// decode converts raw little-endian bytes of dtype dt into dst, which is the
// storage of the tensor being loaded (dst's type follows from dt).
func decode(dt fileDType, raw []byte, dst any, at int) {
	le := binary.LittleEndian
	switch dt {
	case dtF32:
		d := dst.([]float32)[at:]
		for i := range len(raw) / 4 {
			d[i] = math.Float32frombits(le.Uint32(raw[4*i:]))
		}
	case dtF64:
		d := dst.([]float64)[at:]
		for i := range len(raw) / 8 {
			d[i] = math.Float64frombits(le.Uint64(raw[8*i:]))
		}
	case dtI32:
		d := dst.([]int32)[at:]
		for i := range len(raw) / 4 {
			d[i] = int32(le.Uint32(raw[4*i:]))
		}
	case dtBF16:
		d := dst.([]float32)[at:]
		for i := range len(raw) / 2 {
			d[i] = bf16ToF32(le.Uint16(raw[2*i:]))
		}
	case dtF16:
		d := dst.([]float32)[at:]
		for i := range len(raw) / 2 {
			d[i] = f16ToF32(le.Uint16(raw[2*i:]))
		}
	default:
		panic(fmt.Sprintf("ckpt: decode of unchecked dtype %q", dt))
	}
}

// encode appends the little-endian bytes of t's elements from index `from`
// up to `to` to buf.
func encode(buf []byte, t *tensor.Tensor, from, to int) []byte {
	le := binary.LittleEndian
	switch t.DType() {
	case tensor.Float32:
		for _, v := range t.F32()[from:to] {
			buf = le.AppendUint32(buf, math.Float32bits(v))
		}
	case tensor.Float64:
		for _, v := range t.F64()[from:to] {
			buf = le.AppendUint64(buf, math.Float64bits(v))
		}
	case tensor.Int32:
		for _, v := range t.I32()[from:to] {
			buf = le.AppendUint32(buf, uint32(v))
		}
	case tensor.BFloat16, tensor.Float16:
		for _, v := range t.U16()[from:to] {
			buf = le.AppendUint16(buf, v)
		}
	default:
		panic("ckpt: encode of unchecked dtype " + t.DType().String())
	}
	return buf
}
