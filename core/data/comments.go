package data

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// GoComments is the data.format that reads the comments of Go sources as
// the text: the doc comments of the Go toolchain (the default corpus's
// files) are English prose, present wherever Go is installed, and a small
// model trained on them samples sentences where one trained on the code
// samples indentation and braces.
const GoComments = "go_comments"

// Load reads the training text of data.path in data.format: the comments
// of its Go files for GoComments, else the text itself (LoadCorpus).
func Load(path, format string, maxBytes int64) (*Corpus, error) {
	if format == GoComments {
		return LoadGoComments(path, maxBytes)
	}
	return LoadCorpus(path, maxBytes)
}

// LoadGoComments reads the line comments of the non-test Go files under
// path (a file or a directory; GOROOT/src when empty), in sorted path
// order, at most maxBytes of them (maxBytes <= 0: all). Each run of
// consecutive comment lines becomes a paragraph: the lines without their
// "//" and the space after it, then a blank line. Compiler directives
// (//go:build, //line, //export) and the runs that are licence headers
// or generated-code markers are left out; block comments and comments
// after code are too.
func LoadGoComments(path string, maxBytes int64) (*Corpus, error) {
	root, where := path, fmt.Sprintf("%q", path)
	if path == "" {
		r, err := goroot()
		if err != nil {
			return nil, err
		}
		root, where = filepath.Join(r, "src"), "GOROOT/src"
	}
	info, err := os.Stat(root)
	if err != nil {
		return nil, fmt.Errorf("data: data.path %q: %w", root, err)
	}
	files := []string{root}
	if info.IsDir() {
		if files, err = goSourceFiles(root); err != nil {
			return nil, err
		}
	}
	if maxBytes <= 0 {
		maxBytes = 1<<63 - 1
	}
	var text bytes.Buffer
	used := 0
	for _, f := range files {
		if int64(text.Len()) >= maxBytes {
			break
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("data: %w", err)
		}
		n := text.Len()
		appendComments(&text, b)
		if text.Len() > n {
			used++
		}
	}
	out := text.Bytes()
	if int64(len(out)) > maxBytes {
		out = trimPartialRune(out[:maxBytes])
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("data: data.format=%s found no comments in the Go files of %s; set data.format=text to read it as text", GoComments, where)
	}
	return &Corpus{Text: out, Source: fmt.Sprintf("comments of the Go files of %s (%d files, %s)", where, used, sizeString(len(out))), Files: used}, nil
}

// appendComments writes the comment paragraphs of the Go source src to w.
func appendComments(w *bytes.Buffer, src []byte) {
	var para []string
	flush := func() {
		if len(para) > 0 && !strings.HasPrefix(para[0], "Copyright ") && !strings.Contains(para[0], "DO NOT EDIT") {
			for _, l := range para {
				w.WriteString(l)
				w.WriteByte('\n')
			}
			w.WriteByte('\n')
		}
		para = para[:0]
	}
	sc := bufio.NewScanner(bytes.NewReader(src))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "//")
		if !ok {
			flush()
			continue
		}
		if strings.HasPrefix(line, "go:") || strings.HasPrefix(line, "line ") || strings.HasPrefix(line, "export ") {
			continue // a directive, not prose
		}
		para = append(para, strings.TrimPrefix(line, " "))
	}
	flush()
}
