package ckpt

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLoadErrors(t *testing.T) {
	eight := make([]byte, 8)
	twoF32 := `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`
	hugeLen := binary.LittleEndian.AppendUint64(nil, 200<<20)
	hugeLen = append(hugeLen, make([]byte, 64)...)
	cases := []struct {
		name string
		data []byte
		msg  string
	}{
		{"tiny file", []byte{1, 2, 3}, "file is 3 bytes, too short for the 8-byte header length: truncated, or not a safetensors file"},
		{"header past end", file(twoF32)[:20], "header length 56 is more than the 12 bytes that follow it: truncated, or not a safetensors file"},
		{"oversized header", hugeLen, "header length 209715200 is above the 104857600-byte limit: corrupt, or not a safetensors file"},
		{"truncated data", file(twoF32, eight)[:8+56+6], `tensor "a": data_offsets [0, 8] are not a range inside the 6-byte data section`},
		{"not json", file(`hello`, eight), "header is not a JSON object: invalid character 'h' looking for beginning of value"},
		{"array", file(`[1]`), "header is not a JSON object: starts with ["},
		{"cut json", file(`{"a":{"dtype":"F32"`), `header is not valid JSON (at "a"): unexpected EOF`},
		{"trailing", file(`{}x`), "header has 6 unexpected bytes after its JSON object"},
		{"unknown dtype", file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, []byte{1}), `tensor "a": unsupported dtype "U8" (supported: F32, F64, I32, BF16, F16)`},
		{"missing field", file(`{"a":{"dtype":"F32","shape":[1]}}`, eight[:4]), `tensor "a": header record {"dtype":"F32","shape":[1]} needs dtype, shape and data_offsets`},
		{"size mismatch", file(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, eight), `tensor "a": data_offsets [0, 8] span 8 bytes, but shape [3] of F32 needs 12`},
		{"negative dim", file(`{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}`, eight), `tensor "a": negative dimension in shape [-2]`},
		{"overflowing shape", file(`{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}`), `tensor "a": shape [4294967296 4294967296] is too large`},
		{"reversed offsets", file(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}`, eight), `tensor "a": data_offsets [8, 0] are not a range inside the 8-byte data section`},
		{"bad offsets", file(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[0]}}`), `tensor "a": data_offsets [0] must be [begin, end]`},
		{"overlap", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, eight, eight[:4]),
			`tensors "a" and "b" overlap: "a" ends at byte 8 but "b" begins at 4`},
		{"gap", file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, eight), `data bytes [0, 4) before tensor "a" belong to no tensor`},
		{"trailing data", file(twoF32, eight, eight), "data section has 16 bytes but the tensors cover only 8: truncated header or trailing garbage"},
		{"duplicate", file(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}`), `header names "a" twice`},
		{"bad metadata", file(`{"__metadata__":{"k":1}}`), "header __metadata__ must map strings to strings: json: cannot unmarshal number into Go value of type string"},
		{"empty name", file(`{"":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}`), `tensor "": empty tensor name in header`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := writeFile(t, c.data)
			out, meta, err := Load(p)
			require.Error(t, err)
			assert.Nil(t, out)
			assert.Nil(t, meta)
			assert.Equal(t, `ckpt: load "`+p+`": `+c.msg, err.Error())
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "none.safetensors")
	_, _, err := Load(p)
	require.Error(t, err)
	assert.True(t, strings.HasPrefix(err.Error(), `ckpt: load "`+p+`": open `), err.Error())
	assert.ErrorIs(t, err, os.ErrNotExist)
}

func TestLoadAcceptsForeignLayouts(t *testing.T) {
	// Another writer may order entries differently, put metadata last, pad
	// with other whitespace and store data in a different order than names.
	data := append([]byte{1, 0, 0, 0}, 2, 0, 0, 0)
	p := writeFile(t, file(" \n{\"b\":{\"shape\":[1],\"dtype\":\"I32\",\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[4,8]},\"__metadata__\":{\"format\":\"pt\"}}\n", data))
	out, meta, err := Load(p)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"format": "pt"}, meta)
	assert.Equal(t, []int32{2}, out["a"].I32())
	assert.Equal(t, []int32{1}, out["b"].I32())
}
