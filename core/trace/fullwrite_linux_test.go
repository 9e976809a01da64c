package trace

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// A trace that does not fit on its disk is an error naming the key and the
// path, and leaves the previous trace and no temporary file.
func TestWriteFileFullDiskLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=4k"); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, 0) })
	path := filepath.Join(dir, "run.json")
	require.NoError(t, os.WriteFile(path, []byte("old"), 0o644))
	r := New(0)
	for i := 0; i < 200; i++ {
		r.Begin("forward", "compute", Compute).With("micro", i).End()
	}
	err := r.WriteFile(path)
	require.ErrorContains(t, err, "trace "+path+": write "+dir+"/.run.json.tmp-")
	require.ErrorContains(t, err, "no space left on device")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "old", string(b))
}
