package ckpt

import (
	"os"
	"path/filepath"
	"strings"
)

// TempPattern is the name pattern (for os.CreateTemp) of the temporary file
// an atomic write to path goes through: hidden, next to path, so the rename
// stays on one file system.
func TempPattern(path string) string { return "." + filepath.Base(path) + ".tmp-*" }

// RemoveStaleTemps removes the temporary files that earlier writes to path
// left behind when their process was killed before the rename: each is as
// large as the file it was to become, and nothing else would ever remove
// it. Only names of TempPattern(path) are touched, so writes to other files
// in the directory keep theirs. Two processes writing the same path at once
// would remove each other's; nothing in tinyacc does that.
func RemoveStaleTemps(path string) {
	dir := filepath.Dir(path)
	prefix := strings.TrimSuffix(TempPattern(path), "*")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) && e.Type().IsRegular() {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}
