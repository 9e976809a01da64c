package comm

import (
	"bytes"
	"runtime"
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
// decoded, whatever declares it; so are a value cut short and a type byte
// msgpack does not use.
func TestCheckLengthsRefuses(t *testing.T) {
	for _, c := range []struct {
		in   []byte
		want string
	}{
		{[]byte{0x81, 0xa5, 'v', 'a', 'l', 'u', 'e', 0xdd, 0xff, 0xff, 0xff, 0xff}, "msgpack payload of 12 bytes is malformed or cut short: EOF"}, // 2³²-1 elements
		{[]byte{0xdf, 0x7f, 0xff, 0xff, 0xff, 1, 2}, "msgpack payload of 7 bytes is malformed or cut short: EOF"},                                 // 2³¹-1 pairs
		{[]byte{0xc6, 0x10, 0, 0, 0, 1, 2, 3}, "msgpack payload of 8 bytes is malformed or cut short: unexpected EOF"},                            // 256 MiB binary
		{[]byte{0xdb, 0, 0, 1, 0}, "msgpack payload of 5 bytes is malformed or cut short: EOF"},                                                   // 256-byte string
		{[]byte{0xc9, 0, 0, 0, 5, 1, 2, 3}, "msgpack payload of 8 bytes is malformed or cut short: unexpected EOF"},                               // 5-byte extension
		{[]byte{0x93, 1, 2}, "msgpack payload of 3 bytes is malformed or cut short: EOF"},
		{[]byte{0x92, 0xa1, 'x'}, "msgpack payload of 3 bytes is malformed or cut short: EOF"},
		{[]byte{0xcb, 0, 0}, "msgpack payload of 3 bytes is malformed or cut short: unexpected EOF"},
		{[]byte{0xc1}, "msgpack payload of 1 bytes is malformed or cut short: msgpack: unknown code c1"},
		{nil, "msgpack payload of 0 bytes is malformed or cut short: EOF"},
	} {
		assert.EqualError(t, checkLengths(c.in), c.want, "%x", c.in)
	}
	// Through the control decoder, as the malformed frame it is.
	var h hello
	err := decodeControl([]byte{0x81, 0xa5, 't', 'o', 'k', 'e', 'n', 0xdd, 0xff, 0xff, 0xff, 0xff}, &h)
	require.EqualError(t, err, "malformed frame: msgpack payload of 12 bytes is malformed or cut short: EOF")
}

// An abort note whose list of missing ranks declares 2³²-1 elements in a
// 14-byte payload is refused having allocated next to nothing: decoded as
// it is, the list alone would take 32 GiB.
func TestDecodeControlAllocatesWhatThePayloadHolds(t *testing.T) {
	p := []byte{0x81, 0xa7, 'm', 'i', 's', 's', 'i', 'n', 'g', 0xdd, 0xff, 0xff, 0xff, 0xff}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var v abortNote
	err := decodeControl(p, &v)
	runtime.ReadMemStats(&after)
	require.EqualError(t, err, "malformed frame: msgpack payload of 14 bytes is malformed or cut short: EOF")
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20), "bytes allocated decoding a 14-byte payload")
}
