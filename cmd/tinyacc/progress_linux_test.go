package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestProgressEscapesOnlyOnATerminal: the live progress line (carriage
// return, erase to end of line) is written to a terminal and nowhere else:
// not into a pipe, a file, or a character device that is no terminal.
func TestProgressEscapesOnlyOnATerminal(t *testing.T) {
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	require.NoError(t, err)
	defer null.Close()
	pr, pw, err := os.Pipe()
	require.NoError(t, err)
	defer pr.Close()
	defer pw.Close()
	file, err := os.Create(filepath.Join(t.TempDir(), "log"))
	require.NoError(t, err)
	defer file.Close()
	for _, w := range []io.Writer{null, pw, file, &bytes.Buffer{}} {
		require.False(t, isTerminal(w), "%v", w)
	}

	bin := tinyaccBinary(t)
	args := smallRun(3, "--train.log_every=1")
	out, err := exec.Command(bin, args...).Output() // stdout is a pipe
	require.NoError(t, err)
	require.Contains(t, string(out), "step 1/3  loss ")
	require.NotContains(t, string(out), "\r")
	require.NotContains(t, string(out), "\x1b")

	// On a terminal (a pseudo-terminal here) the line is redrawn in place.
	ptm, pts := openPTY(t)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = pts, pts
	require.NoError(t, cmd.Start())
	pts.Close()
	var got bytes.Buffer
	io.Copy(&got, ptm) // ends with EIO once the command has exited
	require.NoError(t, cmd.Wait())
	require.Contains(t, got.String(), "\rstep 2/3  loss ")
	require.Contains(t, got.String(), "\x1b[K")
}

// openPTY opens a pseudo-terminal pair: the controlling side and the
// terminal a child writes to.
func openPTY(t *testing.T) (*os.File, *os.File) {
	ptm, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	require.NoError(t, err)
	t.Cleanup(func() { ptm.Close() })
	var unlock int32
	_, _, e := syscall.Syscall(syscall.SYS_IOCTL, ptm.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock)))
	require.Zero(t, e)
	var n uint32
	_, _, e = syscall.Syscall(syscall.SYS_IOCTL, ptm.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n)))
	require.Zero(t, e)
	pts, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(pts.Name(), "/dev/pts/"))
	return ptm, pts
}

// TestSampleEscapesControlsOnATerminal: sampled text (here a prompt with
// an erase-screen escape, which sample prints first) reaches a terminal
// with its control characters escaped, and a pipe byte for byte.
func TestSampleEscapesControlsOnATerminal(t *testing.T) {
	bin := tinyaccBinary(t)
	w := filepath.Join(t.TempDir(), "w.safetensors")
	out, err := exec.Command(bin, append(smallRun(1), "--save_to="+w)...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	args := []string{"sample", "--from", w, "--prompt", "a\x1b[2Jb\rc", "--tokens", "1"}

	piped, err := exec.Command(bin, args...).Output()
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(piped), "a\x1b[2Jb\rc"), "%q", piped)

	ptm, pts := openPTY(t)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = pts, pts
	require.NoError(t, cmd.Start())
	pts.Close()
	var got bytes.Buffer
	io.Copy(&got, ptm)
	require.NoError(t, cmd.Wait())
	require.True(t, strings.HasPrefix(got.String(), `a\x1b[2Jb\rc`), "%q", got.String())
	require.NotContains(t, got.String(), "\x1b")
}
