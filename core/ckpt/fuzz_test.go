package ckpt

import (
	"bytes"
	"testing"
)

// FuzzLoad feeds arbitrary bytes to the reader: it must never panic, and
// whatever it accepts must be self-consistent.
func FuzzLoad(f *testing.F) {
	f.Add(file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 8)))
	f.Add(file(`{"__metadata__":{"k":"v"},"a":{"dtype":"BF16","shape":[1,2],"data_offsets":[0,4]},"b":{"dtype":"I32","shape":[],"data_offsets":[4,8]}}`, make([]byte, 8)))
	f.Add(file(`{"h":{"dtype":"F16","shape":[0],"data_offsets":[0,0]},"d":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}`, make([]byte, 8)))
	f.Add(file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, make([]byte, 12)))
	f.Add(file(`{}`))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '{', '}'})
	f.Fuzz(func(t *testing.T, data []byte) {
		tensors, meta, err := load(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			if tensors != nil || meta != nil {
				t.Fatalf("error %v with non-nil results", err)
			}
			return
		}
		var total int64
		for name, tn := range tensors {
			if name == "" || name == metadataKey {
				t.Fatalf("accepted tensor name %q", name)
			}
			total += int64(tn.Numel())
		}
		if total > int64(len(data)) {
			t.Fatalf("%d elements from a %d-byte file", total, len(data))
		}
	})
}
