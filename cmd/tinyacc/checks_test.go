package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// An 8 KB file of 4000 "?" lines used to take the YAML library 20 seconds
// and print a 450 MB error; `config show` now refuses it with one line.
func TestConfigShowPathologicalYAML(t *testing.T) {
	path := filepath.Join(t.TempDir(), "q.yaml")
	require.NoError(t, os.WriteFile(path, []byte(strings.Repeat("?\n", 4000)), 0o644))
	code, _, stderr := runCLI("config", "show", "--config", path)
	require.Equal(t, 1, code)
	require.Equal(t, `tinyacc: config: reading config file "`+path+`": yaml: line 2: mapping key "" already defined at line 1`+"\n", stderr)
}
