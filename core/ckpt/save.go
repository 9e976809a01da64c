package ckpt

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// chunkElems bounds the staging buffer used to encode or decode a tensor, so
// a 150 MB embedding is streamed rather than duplicated in memory.
const chunkElems = 1 << 18

// Save writes tensors to path in safetensors format, sorted by name so the
// same tensors always give the same bytes. metadata (optional) goes into the
// header's "__metadata__" entry.
//
// The file is written atomically: everything goes to a temporary file in the
// same directory, which is fsynced and then renamed over path. A crash or an
// error at any point leaves either the old file or the complete new one,
// never a torn checkpoint. Everything that can be checked (names, dtypes) is
// checked before the temporary file is created.
func Save(path string, tensors map[string]*tensor.Tensor, metadata map[string]string) error {
	entries := make([]Entry, 0, len(tensors))
	for name, t := range tensors {
		if t == nil {
			return fmt.Errorf("ckpt: save %q: tensor %q is nil", path, name)
		}
		entries = append(entries, Entry{Name: name, DType: t.DType(), Shape: t.Shape()})
	}
	return SaveStream(path, entries, metadata, func(name string) (*tensor.Tensor, error) { return tensors[name], nil })
}

// Entry names one tensor of a file to be written by SaveStream.
type Entry struct {
	Name  string
	DType tensor.DType
	Shape []int
}

// SaveStream writes a safetensors file whose tensors are produced one at a
// time: next(name) is called once per entry, in name order, and its tensor
// (of the entry's dtype and shape) is written before the next is asked
// for, so no more than one tensor need exist at once (a model gathered
// from its shards tensor by tensor). The file is written atomically, as
// Save's is.
func SaveStream(path string, entries []Entry, metadata map[string]string, next func(name string) (*tensor.Tensor, error)) error {
	entries, err := validateForSave(entries)
	if err != nil {
		return fmt.Errorf("ckpt: save %q: %w", path, err)
	}
	header, err := buildHeader(entries, metadata)
	if err != nil {
		return fmt.Errorf("ckpt: save %q: %w", path, err)
	}
	if err := writeAtomic(path, func(w *bufio.Writer) error {
		// bufio.Writer errors are sticky: a failed write here resurfaces
		// from the next Write below or from writeAtomic's Flush.
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(header)))
		w.Write(n[:])
		w.Write(header)
		buf := make([]byte, 0, chunkElems*8)
		for _, e := range entries {
			t, err := next(e.Name)
			if err != nil {
				return err
			}
			if t == nil || t.DType() != e.DType || !slices.Equal(t.Shape(), e.Shape) {
				return fmt.Errorf("tensor %q was announced as %s %v but came as %v", e.Name, e.DType, e.Shape, t)
			}
			for from := 0; from < t.Numel(); from += chunkElems {
				buf = encode(buf[:0], t, from, min(from+chunkElems, t.Numel()))
				if _, err := w.Write(buf); err != nil {
					return err
				}
			}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("ckpt: save %q: %w", path, err)
	}
	return nil
}

// validateForSave checks every tensor can be written and returns the
// entries in the order they are stored (by name).
func validateForSave(entries []Entry) ([]Entry, error) {
	entries = slices.Clone(entries)
	seen := map[string]bool{}
	for _, e := range entries {
		switch {
		case e.Name == "":
			return nil, fmt.Errorf("a tensor has an empty name; every tensor needs a unique, non-empty name")
		case e.Name == metadataKey:
			return nil, fmt.Errorf("tensor name %q is reserved for the header's metadata; rename the tensor", e.Name)
		case seen[e.Name]:
			return nil, fmt.Errorf("tensor name %q is given twice", e.Name)
		}
		seen[e.Name] = true
		if _, ok := fileDTypeOf(e.DType); !ok {
			return nil, fmt.Errorf("tensor %q has dtype %s, which cannot be saved; convert it to float32, float64 or int32", e.Name, e.DType)
		}
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name < entries[j].Name })
	return entries, nil
}

// buildHeader renders the JSON header, padded with spaces to a multiple of 8
// bytes so the data section that follows stays 8-byte aligned. The layout is
// fixed (metadata first, then tensors by name, fields in a fixed order, no
// spaces) so files are byte-for-byte reproducible.
func buildHeader(entries []Entry, metadata map[string]string) ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	first := true
	if len(metadata) > 0 {
		keys := make([]string, 0, len(metadata))
		for k := range metadata {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteString(`"` + metadataKey + `":{`)
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writeJSONString(&b, k)
			b.WriteByte(':')
			writeJSONString(&b, metadata[k])
		}
		b.WriteByte('}')
		first = false
	}
	var offset int64
	for _, e := range entries {
		dt, _ := fileDTypeOf(e.DType)
		if !first {
			b.WriteByte(',')
		}
		first = false
		writeJSONString(&b, e.Name)
		b.WriteString(`:{"dtype":"` + string(dt) + `","shape":[`)
		for i, d := range e.Shape {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(d))
		}
		end := offset + int64(tensor.Numel(e.Shape))*int64(e.DType.Size())
		fmt.Fprintf(&b, `],"data_offsets":[%d,%d]}`, offset, end)
		offset = end
	}
	b.WriteByte('}')
	for b.Len()%headerAlign != 0 {
		b.WriteByte(' ')
	}
	if b.Len() > maxHeader {
		return nil, fmt.Errorf("header would be %d bytes, above the %d-byte limit readers accept; use fewer tensors or less metadata", b.Len(), maxHeader)
	}
	return b.Bytes(), nil
}

// writeJSONString writes s as a JSON string. HTML escaping is off: names like
// "a<b" stay readable and the file is still valid JSON.
func writeJSONString(b *bytes.Buffer, s string) {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	enc.Encode(s)           // cannot fail for a string
	b.Truncate(b.Len() - 1) // Encode appends a newline
}

// writeAtomic streams fill into a temporary file next to path, fsyncs it and
// renames it over path. The temporary file is removed on any failure, and
// those of earlier writes to path that were killed midway first.
func writeAtomic(path string, fill func(*bufio.Writer) error) (err error) {
	dir := filepath.Dir(path)
	RemoveStaleTemps(path)
	f, err := os.CreateTemp(dir, TempPattern(path))
	if err != nil {
		return fmt.Errorf("cannot create a temporary file in %q (does the directory exist and is it writable?): %w", dir, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	w := bufio.NewWriterSize(f, 1<<20)
	if err = fill(w); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err = w.Flush(); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err = f.Chmod(0o644); err != nil {
		return fmt.Errorf("chmod %s: %w", tmp, err)
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", tmp, err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", tmp, err)
	}
	if err = os.Rename(tmp, path); err != nil {
		return fmt.Errorf("renaming %s to %s: %w", tmp, path, err)
	}
	// Persist the rename itself. Not every platform can fsync a directory,
	// and the data is already safe, so a failure here is not reported.
	if d, derr := os.Open(dir); derr == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
