package trainer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
)

// MetricsWriter writes one JSON object per line, each with a "kind". Every
// line is written when it is produced, so a failing disk is noticed at the
// step that hits it, not at the end of the run; a non-finite number (which
// JSON cannot spell) is written as null rather than losing the record.
type MetricsWriter struct {
	f    *os.File
	path string
	size int64 // bytes of complete lines written
	err  error
}

// NewMetricsWriter creates (truncates) path: the history of a fresh run.
func NewMetricsWriter(path string) (*MetricsWriter, error) {
	return OpenMetricsWriter(path, 0)
}

// OpenMetricsWriter opens path for a run that starts after from completed
// steps. A fresh run (from 0) starts the file anew. A run resumed or
// restarted from a checkpoint keeps the history before it: the rows of
// steps up to from stay, those past it are dropped (the run replays those
// steps, and would otherwise write them twice), as is a last line a killed
// run left half written; new rows are appended. Rows without a step (the
// memory report that ends each part of the run) are kept. So the file
// holds one row per step of the whole run, however often it was resumed.
func OpenMetricsWriter(path string, from int) (*MetricsWriter, error) {
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("trainer: metrics_file %s: %w", path, err)
		}
	}
	if from <= 0 {
		f, err := os.Create(path)
		if err != nil {
			return nil, fmt.Errorf("trainer: metrics_file %s: %w", path, err)
		}
		return &MetricsWriter{f: f, path: path}, nil
	}
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("trainer: metrics_file %s: %w", path, err)
	}
	kept, err := rowsUpTo(old, from)
	if err != nil {
		return nil, fmt.Errorf("trainer: metrics_file %s: %w (move the file away to start a new one)", path, err)
	}
	if err := writeFileAtomic(path, kept); err != nil {
		return nil, fmt.Errorf("trainer: metrics_file %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, fmt.Errorf("trainer: metrics_file %s: %w", path, err)
	}
	return &MetricsWriter{f: f, path: path, size: int64(len(kept))}, nil
}

// rowsUpTo returns the complete lines of a metrics file whose step is at
// most from, or that have no step, in their order.
func rowsUpTo(b []byte, from int) ([]byte, error) {
	var out []byte
	for n := 1; len(b) > 0; n++ {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			break // a line cut short by a killed run
		}
		line := b[:i+1]
		b = b[i+1:]
		var row struct {
			Step *float64 `json:"step"`
		}
		if err := json.Unmarshal(line, &row); err != nil {
			return nil, fmt.Errorf("line %d is not a metrics record: %w", n, err)
		}
		if row.Step == nil || *row.Step <= float64(from) {
			out = append(out, line...)
		}
	}
	return out, nil
}

// Write appends v (a struct with JSON tags) with "kind" set. The first
// failure is returned, naming the key and the path, and every later call
// returns it again without writing.
func (w *MetricsWriter) Write(kind string, v any) error {
	if w.err != nil {
		return w.err
	}
	line, err := metricsLine(kind, v)
	if err == nil {
		_, err = w.f.WriteString(line)
	}
	if err != nil {
		// Take back a partly written line, so the file ends with the last
		// complete record, and close it: the run stops here.
		_ = w.f.Truncate(w.size)
		_ = w.f.Close()
		w.err = fmt.Errorf("trainer: metrics_file %s: %w", w.path, err)
		return w.err
	}
	w.size += int64(len(line))
	return nil
}

// Close closes the file, returning the first write error.
func (w *MetricsWriter) Close() error {
	if w.err != nil {
		return w.err // closed when the write failed
	}
	if err := w.f.Close(); err != nil {
		w.err = fmt.Errorf("trainer: metrics_file %s: %w", w.path, err)
	}
	return w.err
}

// metricsLine encodes the exported fields of struct v in order, after
// "kind", writing a NaN or an infinity as null. A field tagged omitempty is
// left out when it has its zero value.
func metricsLine(kind string, v any) (string, error) {
	rv := reflect.Indirect(reflect.ValueOf(v))
	if rv.Kind() != reflect.Struct {
		return "", fmt.Errorf("metrics record of kind %q is a %s, not a struct", kind, rv.Kind())
	}
	var b bytes.Buffer
	b.WriteString(`{"kind":`)
	k, _ := json.Marshal(kind)
	b.Write(k)
	rt := rv.Type()
	for i := 0; i < rt.NumField(); i++ {
		sf := rt.Field(i)
		if !sf.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(sf.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = sf.Name
		}
		fv := rv.Field(i)
		if strings.Contains(opts, "omitempty") && fv.IsZero() {
			continue
		}
		var val []byte
		if fv.Kind() == reflect.Float64 || fv.Kind() == reflect.Float32 {
			if f := fv.Float(); math.IsNaN(f) || math.IsInf(f, 0) {
				val = []byte("null")
			}
		}
		if val == nil {
			var err error
			if val, err = json.Marshal(fv.Interface()); err != nil {
				return "", err
			}
		}
		fmt.Fprintf(&b, ",%q:", name)
		b.Write(val)
	}
	b.WriteString("}\n")
	return b.String(), nil
}
