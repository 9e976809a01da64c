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

// PartialDir is the name of the directory a checkpoint of step is written
// into before it is complete and renamed to StepDir(step).
func PartialDir(step int) string { return "." + StepDir(step) + ".tmp" }

// RemovePartialDirs removes from root the directories of checkpoints whose
// save did not complete (a process killed mid-save leaves one, as large as
// a checkpoint, and nothing else would ever remove it), returning their
// names. Only names of PartialDir are touched.
func RemovePartialDirs(root string) ([]string, error) {
	entries, err := os.ReadDir(root)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, err
	}
	var removed []string
	for _, e := range entries {
		name, ok := strings.CutPrefix(e.Name(), ".")
		name, ok2 := strings.CutSuffix(name, ".tmp")
		if _, ok3 := ParseStepDir(name); !ok || !ok2 || !ok3 || !e.IsDir() {
			continue
		}
		if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
			return removed, err
		}
		removed = append(removed, e.Name())
	}
	return removed, nil
}
