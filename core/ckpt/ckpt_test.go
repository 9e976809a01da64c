package ckpt

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// file assembles a safetensors image by hand: length prefix, the header text
// padded with spaces to a multiple of 8, then data.
func file(header string, data ...[]byte) []byte {
	for len(header)%8 != 0 {
		header += " "
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	out = append(out, header...)
	for _, d := range data {
		out = append(out, d...)
	}
	return out
}

func writeFile(t *testing.T, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "x.safetensors")
	require.NoError(t, os.WriteFile(p, b, 0o644))
	return p
}

func dirEntries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func TestRoundTripEachDType(t *testing.T) {
	big := make([]float32, 3*chunkElems+17) // spans several streaming chunks
	for i := range big {
		big[i] = float32(i)*0.5 - 3
	}
	in := map[string]*tensor.Tensor{
		"f32":    tensor.FromF32([]float32{1.5, -0, float32(math.Inf(-1)), math.SmallestNonzeroFloat32, math.MaxFloat32, 3}, 2, 3),
		"f64":    tensor.FromF64([]float64{math.Pi, -math.E, math.SmallestNonzeroFloat64, math.MaxFloat64}, 4),
		"i32":    tensor.FromI32([]int32{math.MinInt32, -1, 0, 1, math.MaxInt32, 42}, 3, 1, 2),
		"scalar": tensor.FromF32([]float32{7}),
		"empty":  tensor.FromF64([]float64{}, 0, 5),
		"big":    tensor.FromF32(big, len(big)),
		"nan":    tensor.FromF32([]float32{float32(math.NaN())}, 1),
	}
	meta := map[string]string{"format": "pt", "step": "100", "quote\"<&>": "\u00e9\n"}
	p := filepath.Join(t.TempDir(), "model.safetensors")
	require.NoError(t, Save(p, in, meta))

	out, gotMeta, err := Load(p)
	require.NoError(t, err)
	assert.Equal(t, meta, gotMeta)
	require.Len(t, out, len(in))
	for name, want := range in {
		got := out[name]
		require.NotNil(t, got, name)
		assert.Equal(t, want.DType(), got.DType(), name)
		assert.Equal(t, want.Shape(), got.Shape(), name)
		switch want.DType() {
		case tensor.Float32:
			for i, v := range want.F32() { // compare bits: NaN and -0 included
				assert.Equal(t, math.Float32bits(v), math.Float32bits(got.F32()[i]), "%s[%d]", name, i)
			}
		case tensor.Float64:
			assert.Equal(t, want.F64(), got.F64(), name)
		case tensor.Int32:
			assert.Equal(t, want.I32(), got.I32(), name)
		}
	}
	assert.Equal(t, []string{"model.safetensors"}, dirEntries(t, filepath.Dir(p)), "no temp file left behind")
	info, err := os.Stat(p)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o644), info.Mode().Perm())

	// Loaded tensors are fresh: changing one does not touch the other.
	out["i32"].I32()[0] = 5
	assert.Equal(t, int32(math.MinInt32), in["i32"].I32()[0])
}

func TestSaveExactBytes(t *testing.T) {
	tensors := map[string]*tensor.Tensor{
		"b.weight": tensor.FromF32([]float32{1, -2}, 2),
		"a":        tensor.FromI32([]int32{7, -1}, 1, 2),
		"c":        tensor.FromF64([]float64{0.5}),
	}
	header := `{"__metadata__":{"format":"pt","x<y":"1"},` +
		`"a":{"dtype":"I32","shape":[1,2],"data_offsets":[0,8]},` +
		`"b.weight":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},` +
		`"c":{"dtype":"F64","shape":[],"data_offsets":[16,24]}}`
	want := file(header,
		[]byte{7, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}, // a: 7, -1
		[]byte{0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0},    // b.weight: 1.0, -2.0
		[]byte{0, 0, 0, 0, 0, 0, 0xe0, 0x3f},       // c: 0.5
	)
	require.Equal(t, 0, len(want[8:8+binary.LittleEndian.Uint64(want)])%8)

	p := filepath.Join(t.TempDir(), "tiny.safetensors")
	require.NoError(t, Save(p, tensors, map[string]string{"x<y": "1", "format": "pt"}))
	got, err := os.ReadFile(p)
	require.NoError(t, err)
	assert.Equal(t, string(want), string(got))

	// No metadata: no __metadata__ entry at all.
	require.NoError(t, Save(p, map[string]*tensor.Tensor{"c": tensors["c"]}, nil))
	got, err = os.ReadFile(p)
	require.NoError(t, err)
	assert.Equal(t, string(file(`{"c":{"dtype":"F64","shape":[],"data_offsets":[0,8]}}`, []byte{0, 0, 0, 0, 0, 0, 0xe0, 0x3f})), string(got))
}

func TestLoadHalfPrecisionConverted(t *testing.T) {
	// bfloat16: 1.0, -2.5, 0.15625, -inf.  float16: 1.0, -2, 65504 (max),
	// 2^-24 (smallest subnormal), 2^-15 (subnormal), +inf, -0.
	bf := []byte{0x80, 0x3f, 0x20, 0xc0, 0x20, 0x3e, 0x80, 0xff}
	f16 := []byte{0x00, 0x3c, 0x00, 0xc0, 0xff, 0x7b, 0x01, 0x00, 0x00, 0x02, 0x00, 0x7c, 0x00, 0x80, 0, 0}
	p := writeFile(t, file(
		`{"bf":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},"h":{"dtype":"F16","shape":[8],"data_offsets":[8,24]}}`,
		bf, f16))
	out, meta, err := Load(p)
	require.NoError(t, err)
	assert.Empty(t, meta)
	require.Equal(t, tensor.Float32, out["bf"].DType())
	assert.Equal(t, []int{2, 2}, out["bf"].Shape())
	assert.Equal(t, []float32{1, -2.5, 0.15625, float32(math.Inf(-1))}, out["bf"].F32())
	h := out["h"].F32()
	assert.Equal(t, []float32{1, -2, 65504, float32(math.Ldexp(1, -24)), float32(math.Ldexp(1, -15)), float32(math.Inf(1))}, h[:6])
	assert.Equal(t, uint32(0x80000000), math.Float32bits(h[6]), "negative zero keeps its sign")
	assert.Equal(t, float32(0), h[7])
}

// TestF16AllValues checks every half-precision bit pattern against the
// textbook definition evaluated in float64.
func TestF16AllValues(t *testing.T) {
	for bits := 0; bits < 1<<16; bits++ {
		sign := 1.0
		if bits&0x8000 != 0 {
			sign = -1
		}
		exp, frac := (bits>>10)&0x1f, bits&0x3ff
		got := f16ToF32(uint16(bits))
		switch {
		case exp == 0x1f && frac != 0:
			require.True(t, math.IsNaN(float64(got)), "%#04x", bits)
		case exp == 0x1f:
			require.Equal(t, math.Inf(int(sign)), float64(got), "%#04x", bits)
		case exp == 0:
			require.Equal(t, sign*float64(frac)*math.Ldexp(1, -24), float64(got), "%#04x", bits)
			require.Equal(t, sign < 0, math.Signbit(float64(got)), "%#04x", bits)
		default:
			require.Equal(t, sign*(1+float64(frac)/1024)*math.Ldexp(1, exp-15), float64(got), "%#04x", bits)
		}
	}
}

func TestSaveErrorsLeaveExistingFileUntouched(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "ckpt.safetensors")
	require.NoError(t, Save(p, map[string]*tensor.Tensor{"w": tensor.FromF32([]float32{1}, 1)}, nil))
	before, err := os.ReadFile(p)
	require.NoError(t, err)

	ok := tensor.FromF32([]float32{2}, 1)
	cases := []struct {
		tensors map[string]*tensor.Tensor
		msg     string
	}{
		{map[string]*tensor.Tensor{"w": ok, "": ok}, `ckpt: save "` + p + `": a tensor has an empty name; every tensor needs a unique, non-empty name`},
		{map[string]*tensor.Tensor{"__metadata__": ok}, `ckpt: save "` + p + `": tensor name "__metadata__" is reserved for the header's metadata; rename the tensor`},
		{map[string]*tensor.Tensor{"w": nil}, `ckpt: save "` + p + `": tensor "w" is nil`},
	}
	for _, c := range cases {
		err := Save(p, c.tensors, nil)
		require.EqualError(t, err, c.msg)
		after, err := os.ReadFile(p)
		require.NoError(t, err)
		assert.Equal(t, before, after)
		assert.Equal(t, []string{"ckpt.safetensors"}, dirEntries(t, dir))
	}
}

func TestSaveToMissingDirectory(t *testing.T) {
	parent := t.TempDir()
	p := filepath.Join(parent, "missing", "ckpt.safetensors")
	err := Save(p, map[string]*tensor.Tensor{"w": tensor.FromF32([]float32{1}, 1)}, nil)
	require.Error(t, err)
	assert.True(t, strings.HasPrefix(err.Error(), `ckpt: save "`+p+`": cannot create a temporary file in "`+filepath.Dir(p)+`" (does the directory exist and is it writable?): `), err.Error())
	assert.Empty(t, dirEntries(t, parent))
}

func TestSaveEmptySet(t *testing.T) {
	p := filepath.Join(t.TempDir(), "e.safetensors")
	require.NoError(t, Save(p, nil, nil))
	got, err := os.ReadFile(p)
	require.NoError(t, err)
	assert.Equal(t, file("{}"), got)
	out, meta, err := Load(p)
	require.NoError(t, err)
	assert.Empty(t, out)
	assert.Empty(t, meta)
}

func TestInspect(t *testing.T) {
	p := writeFile(t, file(
		`{"__metadata__":{"format":"pt"},"bf":{"dtype":"BF16","shape":[1,2],"data_offsets":[0,4]},"x":{"dtype":"F64","shape":[],"data_offsets":[4,12]}}`,
		make([]byte, 12)))
	infos, meta, err := Inspect(p)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"format": "pt"}, meta)
	assert.Equal(t, map[string]Info{"bf": {DType: "BF16", Shape: []int{1, 2}}, "x": {DType: "F64", Shape: []int{}}}, infos)

	bad := writeFile(t, file(`{"x":{"dtype":"F64","shape":[],"data_offsets":[0,8]}}`, make([]byte, 4)))
	_, _, err = Inspect(bad)
	require.EqualError(t, err, `ckpt: inspect "`+bad+`": tensor "x": data_offsets [0, 8] are not a range inside the 4-byte data section`)
}
