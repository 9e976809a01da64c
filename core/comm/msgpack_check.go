package comm

import (
	"encoding/binary"
	"fmt"
)

// checkLengths walks the msgpack values in p and fails on one whose
// declared length is more than the bytes left after its header: a string,
// binary or extension longer than what follows, or an array or map of
// more elements than there are bytes (each element takes one at least).
// The decoder allocates what a header declares before reading it (the
// msgpack library's allocation limit does not take effect), so a frame of
// a few bytes declaring an array of billions would take the process's
// memory; checked first, a control payload can ask for no more than its
// own length.
func checkLengths(p []byte) error {
	pending := 1 // values still to read: the one top-level value
	for pending > 0 {
		if len(p) == 0 {
			return fmt.Errorf("msgpack value cut short")
		}
		pending--
		c := p[0]
		p = p[1:]
		var n uint64         // bytes of data (strings, binaries, extensions) or elements
		var data, elems bool // n counts bytes to skip, or elements to read
		switch {
		case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3: // fixint, nil, bool
		case c >= 0x80 && c <= 0x8f: // fixmap
			n, elems = 2*uint64(c&0x0f), true
		case c >= 0x90 && c <= 0x9f: // fixarray
			n, elems = uint64(c&0x0f), true
		case c >= 0xa0 && c <= 0xbf: // fixstr
			n, data = uint64(c&0x1f), true
		default:
			size, kind, ok := msgpackHeader(c)
			if !ok {
				return fmt.Errorf("msgpack type byte 0x%02x is not one", c)
			}
			if len(p) < size {
				return fmt.Errorf("msgpack value cut short")
			}
			switch size {
			case 1:
				n = uint64(p[0])
			case 2:
				n = uint64(binary.BigEndian.Uint16(p))
			case 4:
				n = uint64(binary.BigEndian.Uint32(p))
			}
			p = p[size:]
			switch kind {
			case 'f': // a number (or a fixext): its bytes are skipped
				n = 0
			case 'd':
				data = true
			case 'x':
				n, data = n+1, true // the extension's type byte, then its data
			case 'a':
				elems = true
			case 'm':
				n, elems = 2*n, true
			}
		}
		if n > uint64(len(p)) {
			what := "bytes"
			if elems {
				what = "elements"
			}
			return fmt.Errorf("msgpack value declares %d %s with %d bytes left", n, what, len(p))
		}
		switch {
		case elems:
			pending += int(n)
		case data:
			p = p[n:]
		}
	}
	return nil
}

// msgpackHeader describes the msgpack type byte c past the fixed forms:
// the bytes that follow it before its data (a number's own bytes, or a
// length) and what the length counts: 'f' a number (no length), 'd'
// bytes of a string or binary, 'x' bytes of an extension (after its type
// byte), 'a' array elements, 'm' map pairs.
func msgpackHeader(c byte) (size int, kind byte, ok bool) {
	switch c {
	case 0xcc, 0xd0:
		return 1, 'f', true
	case 0xcd, 0xd1:
		return 2, 'f', true
	case 0xca, 0xce, 0xd2:
		return 4, 'f', true
	case 0xcb, 0xcf, 0xd3:
		return 8, 'f', true
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext: a type byte and 1 to 16 bytes
		return 1 + 1<<(c-0xd4), 'f', true
	case 0xc4, 0xd9:
		return 1, 'd', true
	case 0xc5, 0xda:
		return 2, 'd', true
	case 0xc6, 0xdb:
		return 4, 'd', true
	case 0xc7:
		return 1, 'x', true
	case 0xc8:
		return 2, 'x', true
	case 0xc9:
		return 4, 'x', true
	case 0xdc:
		return 2, 'a', true
	case 0xdd:
		return 4, 'a', true
	case 0xde:
		return 2, 'm', true
	case 0xdf:
		return 4, 'm', true
	}
	return 0, 0, false
}
