package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDeviceAsDataRefused: `train --data.path=/dev/zero --data.max_bytes=0`
// is refused before any work (it would otherwise read without end), and
// train's help says what data.max_bytes=0 means.
func TestDeviceAsDataRefused(t *testing.T) {
	var out, errb bytes.Buffer
	require.Equal(t, 1, run([]string{"train", "--data.path=/dev/zero", "--data.max_bytes=0"}, &out, &errb))
	require.Equal(t, `tinyacc: data: data.path "/dev/zero" is a character device, not a regular file or a directory: point it at a text file, a directory of text files or token shards (a device or a pipe may have no end, and data.max_bytes=0 means no cap: every byte is read)`+"\n", errb.String())
	require.Empty(t, out.String())
	out.Reset()
	require.Equal(t, 0, run([]string{"train", "--help"}, &out, &errb))
	require.Contains(t, out.String(), "data.max_bytes caps the text read from it (8 MiB by default; 0 is\n      no cap: every byte is read). Devices and pipes are refused.\n")
}
