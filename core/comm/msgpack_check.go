package comm

import (
	"bytes"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// checkLengths reads p's msgpack value through without decoding it
// (Decoder.Skip): a string, binary or extension longer than the bytes
// that follow, or an array or map of more elements than are there, ends
// in an error. Decoding into a Go value allocates what a header declares
// before reading it (the library's allocation limit does not take effect
// there), so a frame of a few bytes declaring an array of billions would
// take the process's memory; Skip reads elements one at a time and grows
// its buffer only as bytes arrive, so a payload that passes declares no
// more than it holds.
func checkLengths(p []byte) error {
	if err := msgpack.NewDecoder(bytes.NewReader(p)).Skip(); err != nil {
		return fmt.Errorf("msgpack payload of %d bytes is malformed or cut short: %v", len(p), err)
	}
	return nil
}
