package ckpt

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// Each save killed before its rename left a temporary file the size of the
// checkpoint; the next save to the same path removes them all, and leaves
// the temporary files of other paths alone.
func TestSaveRemovesStaleTemps(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "w.safetensors")
	for _, name := range []string{".w.safetensors.tmp-1", ".w.safetensors.tmp-2929", ".v.safetensors.tmp-7"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), make([]byte, 1000), 0o644))
	}
	require.NoError(t, Save(path, map[string]*tensor.Tensor{"a": tensor.FromF32([]float32{1, 2}, 2)}, nil))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	require.Equal(t, []string{".v.safetensors.tmp-7", "w.safetensors"}, names)
}
