// Package readmetest runs the README's examples as written: every ```sh
// block, in order, in a copy of the repository, so that an example naming
// a missing file, a flag that does not exist or a library not built yet
// fails a test instead of a reader.
//
// It runs only with TINYACC_README_TEST=1 (`make test-readme`, part of
// `make test`): the README itself says `make test`, so `go test ./...`
// must not run it. A block preceded by the line
//
//	<!-- readme-test: skip -->
//
// is not run (the test command itself, pip, other hosts, long
// benchmarks). TINYACC_README_STEPS caps every run's train.steps (the
// config loader applies it, see core/config), so examples keep their
// step counts on the page and stay short here.
package readmetest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// skipMark is the line that keeps the next ```sh block out of the test.
const skipMark = "<!-- readme-test: skip -->"

// block is one ```sh block of the README: its first line's number and its
// text.
type block struct {
	line int
	text string
	skip bool
}

// shBlocks returns the ```sh blocks of a Markdown document in order,
// each marked skip when the last non-blank line before its fence is
// skipMark.
func shBlocks(r io.Reader) ([]block, error) {
	var out []block
	var cur *block
	prev := ""
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && strings.TrimSpace(line) == "```sh":
			cur = &block{line: n, skip: prev == skipMark}
		case cur != nil && strings.TrimSpace(line) == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.text += line + "\n"
		}
		if strings.TrimSpace(line) != "" {
			prev = strings.TrimSpace(line)
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("README.md:%d: a ```sh block that never ends", cur.line)
	}
	return out, sc.Err()
}

func TestShBlocks(t *testing.T) {
	doc := "text\n```sh\na\nb\n```\n\n" + skipMark + "\n\n```sh\nc\n```\n```text\nd\n```\n"
	got, err := shBlocks(strings.NewReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	want := []block{{line: 2, text: "a\nb\n"}, {line: 9, text: "c\n", skip: true}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("blocks %v, want %v", got, want)
	}
}

// readmeSteps is the step count every example is cut to.
const readmeSteps = "2"

// TestReadme runs the README's sh blocks in order in a copy of the
// repository (the files git tracks) and fails on the first block that
// exits non-zero, naming its line and showing its output.
func TestReadme(t *testing.T) {
	if os.Getenv("TINYACC_README_TEST") != "1" {
		t.Skip("set TINYACC_README_TEST=1 to run the README's examples (make test-readme)")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := shBlocks(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	copyTracked(t, root, dir)

	env := append(os.Environ(),
		"TINYACC_README_STEPS="+readmeSteps,
		// A 1 MiB slice of the default corpus: the examples read it in
		// every rank process, and a few steps never reach further.
		"TINYACC_DATA__MAX_BYTES=1048576",
		"PATH="+filepath.Join(runtime.GOROOT(), "bin")+string(os.PathListSeparator)+os.Getenv("PATH"),
		"PYTHONDONTWRITEBYTECODE=1",
	)
	start := time.Now()
	ran := 0
	for _, b := range blocks {
		if b.skip {
			continue
		}
		// Each block gets a deadline so that a hung example fails the
		// test with its output rather than hanging it.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", b.text)
		cmd.Dir, cmd.Env = dir, env
		t0 := time.Now()
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("README.md:%d: the block failed (%v):\n%s\noutput:\n%s", b.line, err, b.text, out)
		}
		ran++
		t.Logf("README.md:%d: ok in %.1fs", b.line, time.Since(t0).Seconds())
	}
	if ran == 0 {
		t.Fatal("README.md has no sh block that is run")
	}
	t.Logf("%d blocks of README.md ran in %.1fs", ran, time.Since(start).Seconds())
}

// copyTracked copies the files of the work tree that git tracks or would
// track (not ignored) under root into dir.
func copyTracked(t *testing.T, root, dir string) {
	t.Helper()
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	list, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files in %s: %v", root, err)
	}
	for _, name := range strings.Split(strings.TrimRight(string(list), "\x00"), "\x00") {
		src := filepath.Join(root, name)
		info, err := os.Lstat(src)
		if err != nil || !info.Mode().IsRegular() {
			continue // deleted in the work tree, or a link
		}
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, data, info.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
}
