package comm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/vmihailenco/msgpack/v5"
)

// Every message on a tcp connection (store or peer) is a frame: a fixed
// 40-byte little-endian header followed by len payload bytes. Data payloads
// are raw tensor bytes; control payloads (hello, store requests) are msgpack
// maps carrying a protocol version. The header is validated before anything
// is allocated, and payload sizes are capped per kind, so a stray or hostile
// connection cannot make a rank allocate unbounded memory.
const (
	headerSize = 40
	frameMagic = 0x7ac1

	// protocolVersion is carried in every hello and store message; a peer
	// speaking another version is refused with both versions named.
	protocolVersion = 1

	maxDataPayload    = 64 << 20 // one chunk of tensor data
	maxControlPayload = 1 << 20  // store request/response, abort note
	// maxHelloPayload caps what a connection that has not yet proven the
	// job token can make a rank allocate: a hello is a few short fields.
	maxHelloPayload = 4 << 10
)

// Frame kinds.
const (
	kindHello      uint8 = 1 // msgpack hello, first frame of every connection
	kindHelloAck   uint8 = 2 // msgpack helloAck
	kindData       uint8 = 3 // a chunk of a message (raw bytes)
	kindProbe      uint8 = 4 // "how far are you on group G?" (no payload)
	kindProbeReply uint8 = 5 // seq = last collective started on group G
	kindBye        uint8 = 6 // orderly close: the peer is leaving, not dead
	kindStoreReq   uint8 = 7 // msgpack storeReq
	kindStoreResp  uint8 = 8 // msgpack storeResp
	kindAbort      uint8 = 9 // msgpack abortNote: "I gave up (group, seq)"
)

// Header flags.
const (
	flagLast uint8 = 1 // the last chunk of a message
	flagShm  uint8 = 2 // the payload is in the shared-memory ring, not on the connection
)

// header is the decoded frame header. For data frames, group/seq/op/step tag
// the message so groups sharing a connection never mix and a rank that runs a
// different collective is detected; offset places the chunk in its message.
type header struct {
	kind   uint8
	dtype  uint8
	op     uint8 // opcode of the operation the message belongs to
	flags  uint8
	ch     uint16 // channel: collective, point-to-point or debug
	step   uint32 // algorithm step within the operation
	length uint32 // payload bytes
	group  uint64
	seq    uint64
	offset uint64 // byte offset of this chunk within its message
}

func (h *header) encode(b []byte) {
	_ = b[headerSize-1]
	binary.LittleEndian.PutUint16(b[0:], frameMagic)
	b[2] = h.kind
	b[3] = h.dtype
	b[4] = h.op
	b[5] = h.flags
	binary.LittleEndian.PutUint16(b[6:], h.ch)
	binary.LittleEndian.PutUint32(b[8:], h.step)
	binary.LittleEndian.PutUint32(b[12:], h.length)
	binary.LittleEndian.PutUint64(b[16:], h.group)
	binary.LittleEndian.PutUint64(b[24:], h.seq)
	binary.LittleEndian.PutUint64(b[32:], h.offset)
}

// errFrame marks a malformed frame; the connection that sent it is dropped.
var errFrame = errors.New("malformed frame")

// decodeHeader parses and validates a header without trusting any field.
func decodeHeader(b []byte) (header, error) {
	if len(b) < headerSize {
		return header{}, fmt.Errorf("%w: %d header bytes, want %d", errFrame, len(b), headerSize)
	}
	if m := binary.LittleEndian.Uint16(b[0:]); m != frameMagic {
		return header{}, fmt.Errorf("%w: bad magic %#x (not a tinyacc connection?)", errFrame, m)
	}
	h := header{
		kind:   b[2],
		dtype:  b[3],
		op:     b[4],
		flags:  b[5],
		ch:     binary.LittleEndian.Uint16(b[6:]),
		step:   binary.LittleEndian.Uint32(b[8:]),
		length: binary.LittleEndian.Uint32(b[12:]),
		group:  binary.LittleEndian.Uint64(b[16:]),
		seq:    binary.LittleEndian.Uint64(b[24:]),
		offset: binary.LittleEndian.Uint64(b[32:]),
	}
	limit, ok := payloadLimit(h.kind)
	if !ok {
		return header{}, fmt.Errorf("%w: unknown kind %d", errFrame, h.kind)
	}
	if int64(h.length) > limit {
		return header{}, fmt.Errorf("%w: kind %d payload of %d bytes exceeds the limit of %d", errFrame, h.kind, h.length, limit)
	}
	return h, nil
}

func payloadLimit(kind uint8) (int64, bool) {
	switch kind {
	case kindData:
		return maxDataPayload, true
	case kindHello, kindHelloAck:
		return maxHelloPayload, true
	case kindStoreReq, kindStoreResp, kindAbort:
		return maxControlPayload, true
	case kindProbe, kindProbeReply, kindBye:
		return 0, true
	}
	return 0, false
}

// readFrame reads one frame. The payload goes into buf when it fits, else
// into a new slice of exactly the (already validated) length.
func readFrame(r io.Reader, hb []byte, buf []byte) (header, []byte, error) {
	h, err := readHeader(r, hb)
	if err != nil {
		return header{}, nil, err
	}
	p, err := readPayload(r, h, buf)
	return h, p, err
}

// readHeader reads and validates one frame header into hb.
func readHeader(r io.Reader, hb []byte) (header, error) {
	if _, err := io.ReadFull(r, hb[:headerSize]); err != nil {
		return header{}, err
	}
	return decodeHeader(hb)
}

// readPayload reads the payload of h, whose length decodeHeader has
// already held to its kind's maximum.
func readPayload(r io.Reader, h header, buf []byte) ([]byte, error) {
	n := int(h.length)
	if n > cap(buf) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return buf, nil
}

// writeControl writes one control frame with a msgpack payload.
func writeControl(w io.Writer, kind uint8, v any) error {
	p, err := msgpack.Marshal(v)
	if err != nil {
		return err
	}
	if limit, _ := payloadLimit(kind); int64(len(p)) > limit {
		return fmt.Errorf("comm: control message of kind %d is %d bytes, over its limit of %d", kind, len(p), limit)
	}
	b := make([]byte, headerSize+len(p))
	h := header{kind: kind, length: uint32(len(p))}
	h.encode(b)
	copy(b[headerSize:], p)
	_, err = w.Write(b)
	return err
}

// readControl reads one frame, checks its kind from the header alone, and
// only then reads and decodes its payload: a frame of another kind cannot
// make the reader allocate that kind's (larger) maximum.
func readControl(r io.Reader, kind uint8, v any) error {
	var hb [headerSize]byte
	h, err := readHeader(r, hb[:])
	if err != nil {
		return err
	}
	if h.kind != kind {
		return fmt.Errorf("%w: got kind %d, want %d", errFrame, h.kind, kind)
	}
	p, err := readPayload(r, h, nil)
	if err != nil {
		return err
	}
	return decodeControl(p, v)
}

// decodeControl decodes a control payload into v, its lengths checked
// first (checkLengths) so that a malformed or hostile frame cannot make
// the decoder allocate more than the payload could hold.
func decodeControl(p []byte, v any) error {
	if err := checkLengths(p); err != nil {
		return fmt.Errorf("%w: %v", errFrame, err)
	}
	dec := msgpack.NewDecoder(bytes.NewReader(p))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %v", errFrame, err)
	}
	return nil
}

// hello opens every connection: it names the rank and proves membership of
// the job with its token.
type hello struct {
	V     int    `msgpack:"v"`
	Token string `msgpack:"token"`
	Rank  int    `msgpack:"rank"`
	World int    `msgpack:"world"`
	Role  string `msgpack:"role"` // "peer" or "store"
}

type helloAck struct {
	V   int    `msgpack:"v"`
	OK  bool   `msgpack:"ok"`
	Err string `msgpack:"err"`
}

type storeReq struct {
	V         int    `msgpack:"v"`
	Op        string `msgpack:"op"` // set, get, add
	Key       string `msgpack:"key"`
	Value     []byte `msgpack:"value"`
	N         int64  `msgpack:"n"`
	TimeoutMs int64  `msgpack:"timeout_ms"`
}

type storeResp struct {
	V     int    `msgpack:"v"`
	OK    bool   `msgpack:"ok"`
	Value []byte `msgpack:"value"`
	N     int64  `msgpack:"n"`
	Err   string `msgpack:"err"`
}
