package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// A .py script given first runs under the launcher with its own flags,
// --help included (not the command's help), with the interpreter --python
// names (a shell here, so the test needs no Python).
func TestLaunchRunsAScriptGivenFirst(t *testing.T) {
	script := filepath.Join(t.TempDir(), "train.py")
	require.NoError(t, os.WriteFile(script, []byte(`echo "rank $RANK of $WORLD_SIZE got $*"`+"\n"), 0o644))
	code, out, errOut := runCLI("launch", "--nproc_per_node", "2", "--python", "/bin/sh", script, "--help", "--lr", "3")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "[rank 0] rank 0 of 2 got --help --lr 3\n")
	require.Contains(t, out, "[rank 1] rank 1 of 2 got --help --lr 3\n")
}
