package process

import (
	"bytes"
	"io"
	"strings"
	"sync"
)

// prefixWriter writes a plugin's output line by line with a prefix, and
// keeps the last lines for error messages.
type prefixWriter struct {
	mu     sync.Mutex
	w      io.Writer
	prefix string
	part   []byte
	last   []string
}

const keepLines = 5

func newPrefixWriter(w io.Writer, prefix string) *prefixWriter {
	return &prefixWriter{w: w, prefix: prefix}
}

func (p *prefixWriter) setPrefix(s string) {
	p.mu.Lock()
	p.prefix = s
	p.mu.Unlock()
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.part = append(p.part, b...)
	for {
		i := bytes.IndexByte(p.part, '\n')
		if i < 0 {
			break
		}
		line := string(p.part[:i])
		p.part = p.part[i+1:]
		if line == "" {
			continue
		}
		p.last = append(p.last, line)
		if len(p.last) > keepLines {
			p.last = p.last[1:]
		}
		io.WriteString(p.w, p.prefix+line+"\n")
	}
	return len(b), nil
}

// tail is the last lines written, joined by " | ".
func (p *prefixWriter) tail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	last := p.last
	if len(p.part) > 0 {
		last = append(append([]string(nil), last...), string(p.part))
	}
	return strings.Join(last, " | ")
}
