package data

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
)

// CheckPath refuses a data path (key is the config key that names it) that
// names something other than regular files and directories: a device such
// as /dev/zero or a pipe has no end, so reading it "whole" (data.max_bytes=0)
// would grow memory for ever, and it cannot be mapped as token shards. It
// looks only at the names path (a file, a directory or a glob) gives, not
// into directories, whose walk takes regular files only. It reads nothing,
// so it runs before any work.
func CheckPath(key, path string) error {
	if path == "" {
		return nil
	}
	files, err := filepath.Glob(path)
	if err != nil || len(files) == 0 {
		files = []string{path}
	}
	sort.Strings(files)
	for _, f := range files {
		info, err := os.Stat(f)
		if err != nil {
			continue // reported where the file is read, with the reason
		}
		if m := info.Mode(); !m.IsRegular() && !m.IsDir() {
			return fmt.Errorf("data: %s %q is %s, not a regular file or a directory: point it at a text file, a directory of text files or token shards (a device or a pipe may have no end, and data.max_bytes=0 means no cap: every byte is read)", key, f, modeName(m))
		}
	}
	return nil
}

// modeName names a file type for messages.
func modeName(m fs.FileMode) string {
	switch {
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	}
	return "not a regular file (" + m.Type().String() + ")"
}
