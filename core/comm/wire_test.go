package comm

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func frameBytes(h header, payload []byte) []byte {
	h.length = uint32(len(payload))
	b := make([]byte, headerSize+len(payload))
	h.encode(b)
	copy(b[headerSize:], payload)
	return b
}

func TestHeaderRoundTrip(t *testing.T) {
	h := header{kind: kindData, dtype: 1, op: opAllReduce, flags: flagLast, ch: chColl, step: 7,
		length: 12, group: 0xdeadbeefcafe, seq: 17, offset: 1 << 40}
	var b [headerSize]byte
	h.encode(b[:])
	got, err := decodeHeader(b[:])
	require.NoError(t, err)
	assert.Equal(t, h, got)
}

func TestDecodeRejectsBadFrames(t *testing.T) {
	var hb [headerSize]byte
	_, _, err := readFrame(bytes.NewReader([]byte("GET / HTTP/1.1\r\n\r\n....................................")), hb[:], nil)
	assert.EqualError(t, err, "malformed frame: bad magic 0x4547 (not a tinyacc connection?)")

	b := frameBytes(header{kind: 200}, nil)
	_, _, err = readFrame(bytes.NewReader(b), hb[:], nil)
	assert.EqualError(t, err, "malformed frame: unknown kind 200")

	// A control frame claiming 2 GiB is refused before anything is allocated.
	big := header{kind: kindHello}
	big.encode(hb[:])
	hb[12], hb[13], hb[14], hb[15] = 0, 0, 0, 0x80
	_, _, err = readFrame(bytes.NewReader(hb[:]), make([]byte, headerSize), nil)
	assert.EqualError(t, err, "malformed frame: kind 1 payload of 2147483648 bytes exceeds the limit of 4096")

	// A hello just over its few KiB is refused from the header alone; a
	// store request of that size is fine.
	big.length = maxHelloPayload + 1
	big.encode(hb[:])
	_, err = decodeHeader(hb[:])
	assert.EqualError(t, err, "malformed frame: kind 1 payload of 4097 bytes exceeds the limit of 4096")
	big.kind = kindStoreReq
	big.encode(hb[:])
	_, err = decodeHeader(hb[:])
	assert.NoError(t, err)

	// A truncated payload is an error, not a short read.
	b = frameBytes(header{kind: kindData}, []byte{1, 2, 3, 4})
	_, _, err = readFrame(bytes.NewReader(b[:len(b)-1]), hb[:], nil)
	assert.EqualError(t, err, "unexpected EOF")
}

// FuzzDecodeFrame feeds arbitrary bytes to the frame reader and the control
// decoders: they must fail cleanly, never panic, and a frame they accept must
// re-encode to the same header bytes.
func FuzzDecodeFrame(f *testing.F) {
	f.Add(frameBytes(header{kind: kindData, op: opAllReduce, flags: flagLast, group: 1, seq: 3}, []byte{1, 2, 3, 4}))
	var hello1 bytes.Buffer
	_ = writeControl(&hello1, kindHello, hello{V: protocolVersion, Token: "t", Rank: 1, World: 2, Role: "peer"})
	f.Add(hello1.Bytes())
	var req bytes.Buffer
	_ = writeControl(&req, kindStoreReq, storeReq{V: protocolVersion, Op: "get", Key: "k", TimeoutMs: 5})
	f.Add(req.Bytes())
	f.Add(frameBytes(header{kind: kindAbort}, []byte{0xdf, 0xff, 0xff, 0xff, 0xff}))
	f.Add([]byte{0xc1, 0x7a, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var hb [headerSize]byte
		h, p, err := readFrame(bytes.NewReader(data), hb[:], nil)
		if err != nil {
			return
		}
		if len(p) != int(h.length) {
			t.Fatalf("payload %d bytes, header says %d", len(p), h.length)
		}
		var again [headerSize]byte
		h.encode(again[:])
		if !bytes.Equal(again[:], data[:headerSize]) {
			t.Fatalf("header does not round-trip: %x vs %x", again, data[:headerSize])
		}
		switch h.kind {
		case kindHello:
			var v hello
			_ = decodeControl(p, &v)
		case kindHelloAck:
			var v helloAck
			_ = decodeControl(p, &v)
		case kindStoreReq:
			var v storeReq
			_ = decodeControl(p, &v)
		case kindStoreResp:
			var v storeResp
			_ = decodeControl(p, &v)
		case kindAbort:
			var v abortNote
			_ = decodeControl(p, &v)
		}
	})
}
