// Package trace records what a rank does over time — forward, backward,
// optimizer, every collective — as spans, and writes them in the Chrome
// trace event format, which chrome://tracing and ui.perfetto.dev open.
// Overlap of communication with compute is then visible on two tracks.
//
// A nil *Recorder records nothing, so code can call it unconditionally.
package trace

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/tinyacc/tinyacc/core/ckpt"
)

// Tracks (Chrome "threads") spans are drawn on.
const (
	Compute = 0 // forward, backward, optimizer
	Comm    = 1 // collectives, drawn while they run
)

// Event is one complete span ("ph": "X"); times are in microseconds since
// the recorder started.
type Event struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat"`
	Ph   string         `json:"ph"`
	TS   float64        `json:"ts"`
	Dur  float64        `json:"dur"`
	PID  int            `json:"pid"`
	TID  int            `json:"tid"`
	Args map[string]any `json:"args,omitempty"`
}

// Recorder collects the spans of one rank. It is safe for concurrent use.
type Recorder struct {
	mu     sync.Mutex
	start  time.Time
	rank   int
	events []Event
}

// New returns a recorder for rank, with time zero now.
func New(rank int) *Recorder { return &Recorder{start: time.Now(), rank: rank} }

// Span is an open span; End closes it.
type Span struct {
	r     *Recorder
	name  string
	cat   string
	tid   int
	begin time.Time
	args  map[string]any
}

// Begin opens a span on a track. cat groups spans ("compute", "comm").
func (r *Recorder) Begin(name, cat string, tid int) Span {
	if r == nil {
		return Span{}
	}
	return Span{r: r, name: name, cat: cat, tid: tid, begin: time.Now()}
}

// With attaches an argument shown when the span is selected.
func (s Span) With(key string, v any) Span {
	if s.r == nil {
		return s
	}
	if s.args == nil {
		s.args = map[string]any{}
	}
	s.args[key] = v
	return s
}

// End closes the span and records it.
func (s Span) End() {
	if s.r == nil {
		return
	}
	end := time.Now()
	s.r.Add(Event{Name: s.name, Cat: s.cat, Ph: "X", TID: s.tid, Args: s.args,
		TS:  float64(s.begin.Sub(s.r.start).Nanoseconds()) / 1e3,
		Dur: float64(end.Sub(s.begin).Nanoseconds()) / 1e3})
}

// Add records an event (its PID is set to the rank).
func (r *Recorder) Add(e Event) {
	if r == nil {
		return
	}
	e.PID = r.rank
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// Events returns a copy of the spans recorded so far.
func (r *Recorder) Events() []Event {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.events...)
}

// RankPath puts the rank in a trace file name: trace.json -> trace.rank0.json.
func RankPath(path string, rank int) string {
	ext := filepath.Ext(path)
	if ext == "" {
		ext = ".json"
	}
	return strings.TrimSuffix(path, filepath.Ext(path)) + fmt.Sprintf(".rank%d", rank) + ext
}

// WriteFile writes the spans as a Chrome trace (an object with
// "traceEvents", plus names for the rank and its tracks), atomically.
func (r *Recorder) WriteFile(path string) error {
	evs := r.Events()
	meta := []Event{
		{Name: "process_name", Ph: "M", PID: r.rank, Args: map[string]any{"name": fmt.Sprintf("rank %d", r.rank)}},
		{Name: "thread_name", Ph: "M", PID: r.rank, TID: Compute, Args: map[string]any{"name": "compute"}},
		{Name: "thread_name", Ph: "M", PID: r.rank, TID: Comm, Args: map[string]any{"name": "comm"}},
	}
	// otherData carries the rank and its time zero on the host's wall
	// clock, from which Merge puts every rank on one clock.
	other := map[string]any{"rank": r.rank, "start_unix_us": r.start.UnixMicro()}
	b, err := json.Marshal(map[string]any{"traceEvents": append(meta, evs...), "displayTimeUnit": "ms", "otherData": other})
	if err != nil {
		return err
	}
	if err := writeAtomic(path, b); err != nil {
		return fmt.Errorf("trace %s: %w", path, err)
	}
	return nil
}

// writeAtomic writes b to a temporary file next to path and renames it over
// path; the temporary file is removed on any failure, so a full disk leaves
// either the old trace or the new one and nothing else.
func writeAtomic(path string, b []byte) (err error) {
	ckpt.RemoveStaleTemps(path)
	f, err := os.CreateTemp(filepath.Dir(path), ckpt.TempPattern(path))
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if _, err = f.Write(b); err != nil {
		return err
	}
	if err = f.Chmod(0o644); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
