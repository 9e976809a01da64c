package comm

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

// Every form the encoder writes passes: the control messages with short
// and long strings and binaries (fixstr, str8, str16; bin8, bin16), and
// nested values of every msgpack type.
func TestCheckLengthsAcceptsEncodings(t *testing.T) {
	long := strings.Repeat("x", 300)
	values := []any{
		hello{V: protocolVersion, Token: "t", Rank: 1, World: 2, Role: "peer"},
		hello{V: protocolVersion, Token: long, Rank: 70000, World: -3, Role: strings.Repeat("r", 40)},
		helloAck{V: 1, OK: true, Err: long},
		storeReq{V: protocolVersion, Op: "set", Key: "k", Value: bytes.Repeat([]byte{7}, 300), TimeoutMs: 1 << 40},
		storeResp{V: 1, OK: true, Value: []byte{1, 2, 3}},
		abortNote{},
		fingerprint{Op: "all_reduce", Count: 1 << 33, DType: "bfloat16", Reduce: "sum", Extra: "root 3"},
		map[string]any{"a": []any{nil, true, false, 1.5, float32(2.5), int8(-100), uint16(60000), int64(-1 << 40), []byte(long)},
			"b": map[string]any{"c": []int{1, 2, 3}}, "e": strings.Repeat("é", 20000)},
	}
	for _, v := range values {
		b, err := msgpack.Marshal(v)
		require.NoError(t, err)
		require.NoError(t, checkLengths(b), "%T %x", v, b[:min(len(b), 32)])
	}
}

// A declared length past the bytes left is refused before anything is
// allocated, whatever declares it; so are a value cut short and a type
// byte msgpack does not use.
func TestCheckLengthsRefuses(t *testing.T) {
	for _, c := range []struct {
		in   []byte
		want string
	}{
		{[]byte{0x81, 0xa5, 'v', 'a', 'l', 'u', 'e', 0xdd, 0xff, 0xff, 0xff, 0xff}, "msgpack value declares 4294967295 elements with 0 bytes left"},
		{[]byte{0xdf, 0x7f, 0xff, 0xff, 0xff, 1, 2}, "msgpack value declares 4294967294 elements with 2 bytes left"},
		{[]byte{0xc6, 0x10, 0, 0, 0, 1, 2, 3}, "msgpack value declares 268435456 bytes with 3 bytes left"},
		{[]byte{0xdb, 0, 0, 1, 0}, "msgpack value declares 256 bytes with 0 bytes left"},
		{[]byte{0xc9, 0, 0, 0, 5, 1, 2, 3}, "msgpack value declares 6 bytes with 3 bytes left"},
		{[]byte{0x93, 1, 2}, "msgpack value declares 3 elements with 2 bytes left"},
		{[]byte{0x92, 0xa1, 'x'}, "msgpack value cut short"},
		{[]byte{0xcb, 0, 0}, "msgpack value cut short"},
		{[]byte{0xc1}, "msgpack type byte 0xc1 is not one"},
		{nil, "msgpack value cut short"},
	} {
		assert.EqualError(t, checkLengths(c.in), c.want, "%x", c.in)
	}
	// Through the control decoder, as the malformed frame it is.
	var h hello
	err := decodeControl([]byte{0x81, 0xa5, 't', 'o', 'k', 'e', 'n', 0xdd, 0xff, 0xff, 0xff, 0xff}, &h)
	require.EqualError(t, err, "malformed frame: msgpack value declares 4294967295 elements with 0 bytes left")
}
