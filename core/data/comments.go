package data

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// GoComments is the data.format that reads the doc comments of Go
// sources as the text: those of the Go toolchain (the default corpus's
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

// LoadGoComments reads the doc comments of the non-test Go files under
// path (a file or a directory; GOROOT/src when empty), in sorted path
// order, as prose (appendComments says which comments and how), at most
// maxBytes of it (maxBytes <= 0: all).
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
	used, seen := 0, map[string]bool{}
	for _, f := range files {
		if int64(text.Len()) >= maxBytes {
			break
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("data: %w", err)
		}
		n := text.Len()
		appendComments(&text, b, seen)
		if text.Len() > n {
			used++
		}
	}
	out := text.Bytes()
	if int64(len(out)) > maxBytes {
		out = trimPartialRune(out[:maxBytes])
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("data: data.format=%s found no doc comments in the Go files of %s; set data.format=text to read it as text", GoComments, where)
	}
	return &Corpus{Text: out, Source: fmt.Sprintf("doc comments of the Go files of %s (%d files, %s)", where, used, sizeString(len(out))), Files: used}, nil
}

// appendComments writes the doc comments of the Go source src to w as
// prose, one paragraph a line, each paragraph once (seen holds those
// already written, across files). A doc comment is a run of "//" lines
// at the start of a line directly above a top-level declaration (package,
// func, type, var, const): these are written as sentences ("Read reads up
// to len(p) bytes into p."), where the comments inside function bodies,
// the compiler's rewrite rules and the licence headers are notes, tables
// and code that a small model learns as noise. A generated file (one
// with Go's "// Code generated ... DO NOT EDIT." line) is left out whole:
// its comments are one template repeated. Inside a comment, a
// blank line ends a paragraph; an indented line (a code block, a list
// item), a heading ("# Title") or a directive (//go:build) ends it too
// and is left out; a paragraph with a URL is left out whole; the words of
// a paragraph are joined by single spaces.
func appendComments(w *bytes.Buffer, src []byte, seen map[string]bool) {
	if generated.Match(src) {
		return
	}
	var run []string // the comment lines above the current line
	sc := bufio.NewScanner(bytes.NewReader(src))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if text, ok := strings.CutPrefix(line, "//"); ok {
			run = append(run, text)
			continue
		}
		if isDecl(line) {
			writeDoc(w, run, seen)
		}
		run = run[:0]
	}
}

// generated matches the line that marks a generated Go file
// (go help generate).
var generated = regexp.MustCompile(`(?m)^// Code generated .* DO NOT EDIT\.$`)

// isDecl reports whether line starts a top-level declaration that go doc
// shows: the package clause, or a func, method, type, var or const whose
// name is exported, or a group of them ("const (").
func isDecl(line string) bool {
	if strings.HasPrefix(line, "package ") {
		return true
	}
	for _, kw := range []string{"func ", "type ", "var ", "const "} {
		if rest, ok := strings.CutPrefix(line, kw); ok {
			if kw == "func " && strings.HasPrefix(rest, "(") { // a method: its name follows the receiver
				if i := strings.Index(rest, ") "); i >= 0 {
					rest = rest[i+2:]
				}
			}
			return rest != "" && (rest[0] == '(' || 'A' <= rest[0] && rest[0] <= 'Z')
		}
	}
	return false
}

// writeDoc writes the prose paragraphs of one doc comment's lines (their
// "//" cut off) to w, as appendComments says.
func writeDoc(w *bytes.Buffer, lines []string, seen map[string]bool) {
	if len(lines) > 0 && strings.HasPrefix(strings.TrimSpace(lines[0]), "Copyright ") {
		return
	}
	var words []string
	flush := func() {
		p := strings.Join(words, " ")
		words = words[:0]
		if p == "" || seen[p] || strings.Contains(p, "://") {
			return
		}
		seen[p] = true
		w.WriteString(p)
		w.WriteByte('\n')
	}
	for _, l := range lines {
		text := strings.TrimPrefix(l, " ")
		if strings.TrimSpace(text) == "" || text[0] == ' ' || text[0] == '\t' || strings.HasPrefix(text, "# ") ||
			strings.HasPrefix(l, "go:") || strings.HasPrefix(l, "line ") || strings.HasPrefix(l, "export ") {
			flush()
			continue
		}
		words = append(words, strings.Fields(text)...)
	}
	flush()
}
