package launch

import (
	"bufio"
	"errors"
	"io"
	"sync"
)

// maxLine bounds how much of one line is buffered before it is passed on: a
// rank printing a progress bar with no newline must not grow the launcher's
// memory without limit. Longer lines come out in maxLine pieces, each
// prefixed.
const maxLine = 64 << 10

// maxTailLine bounds each line kept for the failure summary, which is read by
// a person, not parsed.
const maxTailLine = 1024

// output serializes whole lines from all ranks onto the launcher's stdout and
// stderr. One mutex covers both streams because they are often the same
// terminal or the same buffer, and a line must never be split by another.
type output struct {
	mu             sync.Mutex
	stdout, stderr io.Writer
}

// writeLine writes one already-terminated line in a single Write call. Write
// errors are dropped on purpose: a closed stdout must not stop the launcher
// from draining (and so unblocking) its ranks.
func (o *output) writeLine(w io.Writer, line []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, _ = w.Write(line)
}

// log writes a launcher message to stderr without interleaving with ranks.
func (o *output) log(msg string) {
	if len(msg) == 0 || msg[len(msg)-1] != '\n' {
		msg += "\n"
	}
	o.writeLine(o.stderr, []byte(msg))
}

// tail keeps a rank's last lines, from both streams in arrival order, for the
// failure summary: the cause of a crash is almost always in its last words.
// Each slot's buffer is reused, so a rank printing for days costs the
// launcher no more than one printing for seconds.
type tail struct {
	mu    sync.Mutex
	lines [][]byte
	next  int
	full  bool
}

func newTail(n int) *tail { return &tail{lines: make([][]byte, n)} }

func (t *tail) add(line []byte) {
	cut := len(line) > maxTailLine
	if cut {
		line = line[:maxTailLine]
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines[t.next] = append(t.lines[t.next][:0], line...)
	if cut {
		t.lines[t.next] = append(t.lines[t.next], "..."...)
	}
	t.next = (t.next + 1) % len(t.lines)
	if t.next == 0 {
		t.full = true
	}
}

// snapshot returns the kept lines, oldest first.
func (t *tail) snapshot() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	if t.full {
		for _, l := range t.lines[t.next:] {
			out = append(out, string(l))
		}
	}
	for _, l := range t.lines[:t.next] {
		out = append(out, string(l))
	}
	return out
}

// pump copies r to w line by line, each line prefixed, until r ends. A last
// line without a newline is still written, terminated, so that nothing a
// crashing rank printed is lost. The line buffer is reused: the relay holds
// no state that grows with the lines it passes on.
func (o *output) pump(r io.Reader, w io.Writer, prefix string, t *tail) {
	br := bufio.NewReaderSize(r, maxLine)
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(chunk) > 0 {
			body := chunk
			if body[len(body)-1] == '\n' {
				body = body[:len(body)-1]
			}
			line = append(append(append(line[:0], prefix...), body...), '\n')
			o.writeLine(w, line)
			t.add(body)
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}
