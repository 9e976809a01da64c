package data

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"unicode/utf8"
)

// Corpus is the raw text a run trains on, kept as bytes: with the byte
// tokenizer the token stream is the bytes themselves.
type Corpus struct {
	// Text is the concatenated content, at most maxBytes long.
	Text []byte
	// Source says where Text came from, for logs and run summaries, e.g.
	// "GOROOT/src Go files (1234 files, 8.0 MiB)".
	Source string
	// Files is the number of files that contributed bytes (the last one may
	// have been cut short by the cap).
	Files int
}

// LoadCorpus reads the training text. path may name a file, or a directory
// whose regular files are read recursively in sorted path order and
// concatenated. An empty path selects the default corpus: the non-test Go
// sources of the local Go installation, which every machine that builds
// tinyacc has, so a run needs no download. Reading stops once maxBytes bytes
// have been collected (maxBytes <= 0 means no cap: every byte of path is
// read), so a large tree costs only a directory listing beyond the cap. A
// device or a pipe is refused (CheckPath): it would be read without end.
func LoadCorpus(path string, maxBytes int64) (*Corpus, error) {
	if maxBytes <= 0 {
		maxBytes = math.MaxInt64
	}
	if path == "" {
		return loadDefaultCorpus(maxBytes)
	}
	info, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("data: data.path %q does not exist: %w", path, err)
		}
		return nil, fmt.Errorf("data: cannot read data.path %q: %w", path, err)
	}
	if err := CheckPath("data.path", path); err != nil {
		return nil, err
	}
	var files []string
	if info.IsDir() {
		if files, err = regularFiles(path); err != nil {
			return nil, err
		}
	} else {
		files = []string{path}
	}
	text, used, skipped, err := readCappedText(files, maxBytes, info.IsDir())
	if err != nil {
		return nil, err
	}
	if len(text) == 0 {
		what := "file"
		if info.IsDir() {
			what = fmt.Sprintf("directory with %d regular files", len(files))
		}
		return nil, fmt.Errorf("data: corpus at data.path %q is empty (%s): point data.path at non-empty text, or set it to \"\" for the default corpus", path, what)
	}
	src := fmt.Sprintf("file %q (%s)", path, sizeString(len(text)))
	if info.IsDir() {
		src = fmt.Sprintf("directory %q (%d text files, %s", path, used, sizeString(len(text)))
		if skipped > 0 {
			src += fmt.Sprintf("; %d files that are not text skipped", skipped)
		}
		src += ")"
	}
	if all := totalSize(files); int64(len(text)) == maxBytes && all > maxBytes {
		// Said once, where the run names its data.
		src += fmt.Sprintf("; read %s of %s (data.max_bytes; 0 reads everything)", sizeString(len(text)), sizeString(int(all)))
	}
	return &Corpus{Text: text, Source: src, Files: used}, nil
}

// Tokens returns the token stream of the whole corpus.
func (c *Corpus) Tokens() []int32 { return EncodeBytes(c.Text) }

// Split tokenizes the corpus and cuts it in two: validation is the last
// valFraction of the stream (floor of len·valFraction tokens), training the
// rest. Taking the tail rather than random samples keeps the two sets from
// sharing windows. valFraction must be in [0, 1]; config validation ensures
// that, so anything else is a programming error and panics.
func (c *Corpus) Split(valFraction float64) (train, val []int32) {
	if !(valFraction >= 0 && valFraction <= 1) {
		panic(fmt.Sprintf("data: Split(%v): valFraction must be in [0, 1]", valFraction))
	}
	all := c.Tokens()
	nVal := int(math.Floor(float64(len(all)) * valFraction))
	cut := len(all) - nVal
	return all[:cut:cut], all[cut:]
}

// loadDefaultCorpus reads the Go sources of GOROOT/src.
func loadDefaultCorpus(maxBytes int64) (*Corpus, error) {
	root, err := goroot()
	if err != nil {
		return nil, err
	}
	src := filepath.Join(root, "src")
	files, err := goSourceFiles(src)
	if err != nil {
		return nil, err
	}
	text, used, err := readCapped(files, maxBytes)
	if err != nil {
		return nil, err
	}
	if len(text) == 0 {
		return nil, fmt.Errorf("data: default corpus is empty: no Go files under %s; set data.path to a text file or directory", src)
	}
	desc := fmt.Sprintf("GOROOT/src Go files (%d files, %s)", used, sizeString(len(text)))
	if all := totalSize(files); int64(len(text)) == maxBytes && all > maxBytes {
		desc += fmt.Sprintf("; read %s of %s (data.max_bytes; 0 reads everything)", sizeString(len(text)), sizeString(int(all)))
	}
	return &Corpus{Text: text, Source: desc, Files: used}, nil
}

// goroot finds the Go installation. runtime.GOROOT is the cheap answer but
// names the build machine's path for a binary built elsewhere (or nothing with
// -trimpath), so it is trusted only if the directory exists; otherwise the go
// command on PATH is asked.
func goroot() (string, error) {
	if r := runtime.GOROOT(); r != "" && isDir(filepath.Join(r, "src")) {
		return r, nil
	}
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		return "", fmt.Errorf("data: the default corpus needs the Go sources, but GOROOT is unknown (no Go toolchain found: %v); set data.path to a text file or directory", err)
	}
	r := strings.TrimSpace(string(out))
	if r == "" || !isDir(filepath.Join(r, "src")) {
		return "", fmt.Errorf("data: the default corpus needs the Go sources, but `go env GOROOT` gave %q, which has no src directory; set data.path to a text file or directory", r)
	}
	return r, nil
}

func isDir(p string) bool {
	info, err := os.Stat(p)
	return err == nil && info.IsDir()
}

// goSourceFiles lists, in sorted path order, the .go files under root that are
// not tests and not inside a testdata directory: the code a Go programmer
// would read, without generated test fixtures that are often huge or
// deliberately malformed.
func goSourceFiles(root string) ([]string, error) {
	root, err := resolveRoot(root)
	if err != nil {
		return nil, fmt.Errorf("data: listing default corpus: %w", err)
	}
	var files []string
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("data: listing default corpus under %s: %w", root, err)
		}
		if d.IsDir() {
			if d.Name() == "testdata" && p != root {
				return filepath.SkipDir
			}
			return nil
		}
		name := d.Name()
		if d.Type().IsRegular() && strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	return files, nil
}

// regularFiles lists every regular file under root in sorted path order.
// Sorting whole paths (rather than trusting the walk's per-directory order)
// makes the concatenation order a simple, documented rule. Symlinks and other
// special files are skipped so a link cannot pull in text from elsewhere or
// loop.
func regularFiles(root string) ([]string, error) {
	root, err := resolveRoot(root)
	if err != nil {
		return nil, fmt.Errorf("data: listing data.path: %w", err)
	}
	var files []string
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("data: listing data.path %q: %w", root, err)
		}
		if d.Type().IsRegular() {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	return files, nil
}

// resolveRoot follows symlinks in a tree's root: the walk itself never
// follows links, so without this a linked directory (a GOROOT installed as
// /usr/lib/go -> go-1.x, say) would look empty.
func resolveRoot(root string) (string, error) {
	return filepath.EvalSymlinks(root)
}

// readCapped concatenates files until maxBytes are collected, cutting the last
// file short if needed. It returns the text and how many files contributed.
func readCapped(files []string, maxBytes int64) ([]byte, int, error) {
	text, used, _, err := readCappedText(files, maxBytes, false)
	return text, used, err
}

// readCappedText is readCapped that, with textOnly, skips files that are
// not text (a NUL byte, or not valid UTF-8) and counts them.
func readCappedText(files []string, maxBytes int64, textOnly bool) ([]byte, int, int, error) {
	var text bytes.Buffer
	used, skipped := 0, 0
	for _, p := range files {
		left := maxBytes - int64(text.Len())
		if left <= 0 {
			break
		}
		b, err := readUpTo(p, left)
		if err != nil {
			return nil, 0, 0, err
		}
		check := b
		if int64(len(b)) == left {
			check = trimPartialRune(b) // the cap may have cut the last rune
		}
		if textOnly && (bytes.IndexByte(b, 0) >= 0 || !utf8.Valid(check)) {
			skipped++
			continue
		}
		text.Write(b)
		if len(b) > 0 {
			used++
		}
	}
	return text.Bytes(), used, skipped, nil
}

// readUpTo reads at most n bytes of the file at p.
func readUpTo(p string, n int64) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("data: reading corpus file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, n))
	if err != nil {
		return nil, fmt.Errorf("data: reading corpus file %s: %w", p, err)
	}
	return b, nil
}

// trimPartialRune drops an incomplete UTF-8 sequence that a cap cut at
// the end, so a cut file is not mistaken for binary.
func trimPartialRune(b []byte) []byte {
	for i := 1; i <= 3 && i <= len(b); i++ {
		if utf8.RuneStart(b[len(b)-i]) {
			if !utf8.FullRune(b[len(b)-i:]) {
				return b[:len(b)-i]
			}
			break
		}
	}
	return b
}

// totalSize is the bytes of every file (those that cannot be read: 0).
func totalSize(files []string) int64 {
	var n int64
	for _, p := range files {
		if info, err := os.Stat(p); err == nil {
			n += info.Size()
		}
	}
	return n
}

// sizeString formats a byte count for humans, e.g. "8.0 MiB".
func sizeString(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
