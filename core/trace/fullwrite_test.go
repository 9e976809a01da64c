package trace

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// A write killed before its rename leaves a temporary file; the next write
// to the same path removes it, and leaves other files' alone.
func TestWriteFileRemovesStaleTemps(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "run.json")
	for _, name := range []string{".run.json.tmp-123", ".run.json.tmp-abc", ".other.json.tmp-1"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("partial"), 0o644))
	}
	require.NoError(t, New(0).WriteFile(path))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	require.Equal(t, []string{".other.json.tmp-1", "run.json"}, names)
}
