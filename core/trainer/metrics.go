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

// NewMetricsWriter creates (truncates) path.
func NewMetricsWriter(path string) (*MetricsWriter, error) {
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("trainer: metrics_file %s: %w", path, err)
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("trainer: metrics_file %s: %w", path, err)
	}
	return &MetricsWriter{f: f, path: path}, nil
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
