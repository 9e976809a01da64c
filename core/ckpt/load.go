package ckpt

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// entry is one tensor's header record, checked.
type entry struct {
	name       string
	dt         fileDType
	shape      []int
	numel      int
	begin, end int64 // relative to the data section
}

// Load reads every tensor of a safetensors file into new, caller-owned
// tensors (BF16 and F16 are widened to float32) and returns them with the
// header's metadata (empty if none).
//
// The whole header is validated before any data is read: a sane header
// length, well-formed JSON, known dtypes, byte sizes matching the shapes, and
// byte ranges that tile the data section exactly, with no overlap, gap or
// trailing bytes. A truncated or corrupted checkpoint is therefore reported,
// naming the file and the tensor, rather than loaded as garbage weights.
func Load(path string) (tensors map[string]*tensor.Tensor, metadata map[string]string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("ckpt: load %q: %w", path, err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("ckpt: load %q: %w", path, err)
	}
	tensors, metadata, err = load(f, info.Size())
	if err != nil {
		return nil, nil, fmt.Errorf("ckpt: load %q: %w", path, err)
	}
	return tensors, metadata, nil
}

// Info describes one stored tensor without its data.
type Info struct {
	// DType is the dtype as stored: "F32", "F64", "I32", "BF16" or "F16".
	DType string
	Shape []int
}

// Inspect reads and validates only the header of a safetensors file, for
// tools that list a checkpoint or check shapes before paying for the data
// (a GPT-2 file is hundreds of megabytes).
func Inspect(path string) (map[string]Info, map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("ckpt: inspect %q: %w", path, err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("ckpt: inspect %q: %w", path, err)
	}
	entries, metadata, _, err := readHeader(f, info.Size())
	if err != nil {
		return nil, nil, fmt.Errorf("ckpt: inspect %q: %w", path, err)
	}
	out := make(map[string]Info, len(entries))
	for _, e := range entries {
		out[e.name] = Info{DType: string(e.dt), Shape: e.shape}
	}
	return out, metadata, nil
}

// load reads a safetensors image of size bytes from r.
func load(r io.ReaderAt, size int64) (map[string]*tensor.Tensor, map[string]string, error) {
	entries, metadata, dataStart, err := readHeader(r, size)
	if err != nil {
		return nil, nil, err
	}
	tensors := make(map[string]*tensor.Tensor, len(entries))
	var raw []byte
	for _, e := range entries {
		t, store := newTensor(e)
		es := int64(e.dt.size())
		for at := int64(0); at < int64(e.numel); at += chunkElems {
			n := min(int64(e.numel)-at, chunkElems)
			if cap(raw) < int(n*es) {
				raw = make([]byte, chunkElems*8)
			}
			buf := raw[:n*es]
			if _, err := r.ReadAt(buf, dataStart+e.begin+at*es); err != nil {
				return nil, nil, fmt.Errorf("tensor %q: reading data: %w", e.name, err)
			}
			decode(e.dt, buf, store, int(at))
		}
		tensors[e.name] = t
	}
	return tensors, metadata, nil
}

// newTensor allocates the tensor for e, float32 for the half types.
func newTensor(e entry) (*tensor.Tensor, any) {
	switch e.dt {
	case dtF64:
		s := make([]float64, e.numel)
		return tensor.FromF64(s, e.shape...), s
	case dtI32:
		s := make([]int32, e.numel)
		return tensor.FromI32(s, e.shape...), s
	}
	s := make([]float32, e.numel)
	return tensor.FromF32(s, e.shape...), s
}

// readHeader parses and validates the header, returning the entries in file
// order and the absolute offset of the data section.
func readHeader(r io.ReaderAt, size int64) ([]entry, map[string]string, int64, error) {
	if size < 8 {
		return nil, nil, 0, fmt.Errorf("file is %d bytes, too short for the 8-byte header length: truncated, or not a safetensors file", size)
	}
	var lenBuf [8]byte
	if _, err := r.ReadAt(lenBuf[:], 0); err != nil {
		return nil, nil, 0, fmt.Errorf("reading header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > maxHeader {
		return nil, nil, 0, fmt.Errorf("header length %d is above the %d-byte limit: corrupt, or not a safetensors file", n, maxHeader)
	}
	if n > uint64(size-8) {
		return nil, nil, 0, fmt.Errorf("header length %d is more than the %d bytes that follow it: truncated, or not a safetensors file", n, size-8)
	}
	hdr := make([]byte, n)
	if _, err := r.ReadAt(hdr, 8); err != nil {
		return nil, nil, 0, fmt.Errorf("reading header: %w", err)
	}
	dataStart := 8 + int64(n)
	entries, metadata, err := parseHeader(hdr, size-dataStart)
	return entries, metadata, dataStart, err
}

// rawEntry mirrors a header record; pointers tell a missing field from a zero.
type rawEntry struct {
	DType       *string  `json:"dtype"`
	Shape       *[]int64 `json:"shape"`
	DataOffsets *[]int64 `json:"data_offsets"`
}

// parseHeader decodes the JSON header and checks every record against a data
// section of dataLen bytes.
func parseHeader(hdr []byte, dataLen int64) ([]entry, map[string]string, error) {
	dec := json.NewDecoder(bytes.NewReader(hdr))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, nil, fmt.Errorf("header is not a JSON object: %s", describe(tok, err))
	}
	metadata := map[string]string{}
	var entries []entry
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, fmt.Errorf("header is not valid JSON: %w", err)
		}
		name := tok.(string) // inside an object, More guarantees a key
		if seen[name] {
			return nil, nil, fmt.Errorf("header names %q twice", name)
		}
		seen[name] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, nil, fmt.Errorf("header is not valid JSON (at %q): %w", name, err)
		}
		if name == metadataKey {
			if err := json.Unmarshal(raw, &metadata); err != nil {
				return nil, nil, fmt.Errorf("header %s must map strings to strings: %w", metadataKey, err)
			}
			if metadata == nil { // "__metadata__": null
				metadata = map[string]string{}
			}
			continue
		}
		e, err := checkEntry(name, raw, dataLen)
		if err != nil {
			return nil, nil, err
		}
		entries = append(entries, e)
	}
	if _, err := dec.Token(); err != nil {
		return nil, nil, fmt.Errorf("header is not valid JSON: %w", err)
	}
	if rest := hdr[dec.InputOffset():]; len(bytes.TrimLeft(rest, " \t\r\n")) != 0 {
		return nil, nil, fmt.Errorf("header has %d unexpected bytes after its JSON object", len(rest))
	}
	if err := checkTiling(entries, dataLen); err != nil {
		return nil, nil, err
	}
	return entries, metadata, nil
}

// describe renders what was found where a JSON object should start.
func describe(tok json.Token, err error) string {
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("starts with %v", tok)
}

// checkEntry validates one tensor record on its own.
func checkEntry(name string, raw json.RawMessage, dataLen int64) (entry, error) {
	fail := func(format string, args ...any) (entry, error) {
		return entry{}, fmt.Errorf("tensor %q: "+format, append([]any{name}, args...)...)
	}
	if name == "" {
		return fail("empty tensor name in header")
	}
	var re rawEntry
	if err := json.Unmarshal(raw, &re); err != nil {
		return fail("malformed header record: %v", err)
	}
	if re.DType == nil || re.Shape == nil || re.DataOffsets == nil {
		return fail("header record %s needs dtype, shape and data_offsets", raw)
	}
	e := entry{name: name, dt: fileDType(*re.DType)}
	es := e.dt.size()
	if es == 0 {
		return fail("unsupported dtype %q (supported: F32, F64, I32, BF16, F16)", *re.DType)
	}
	// Multiply with an overflow guard: a hostile shape must not wrap around
	// to a small size that passes the byte-count check.
	numel := int64(1)
	e.shape = make([]int, len(*re.Shape))
	for i, d := range *re.Shape {
		if d < 0 {
			return fail("negative dimension in shape %v", *re.Shape)
		}
		if d != 0 && numel > math.MaxInt64/int64(es)/d {
			return fail("shape %v is too large", *re.Shape)
		}
		numel *= d
		e.shape[i] = int(d)
	}
	e.numel = int(numel)
	off := *re.DataOffsets
	if len(off) != 2 {
		return fail("data_offsets %v must be [begin, end]", off)
	}
	e.begin, e.end = off[0], off[1]
	if e.begin < 0 || e.end < e.begin || e.end > dataLen {
		return fail("data_offsets [%d, %d] are not a range inside the %d-byte data section", e.begin, e.end, dataLen)
	}
	if want := numel * int64(es); e.end-e.begin != want {
		return fail("data_offsets [%d, %d] span %d bytes, but shape %v of %s needs %d", e.begin, e.end, e.end-e.begin, *re.Shape, e.dt, want)
	}
	return e, nil
}

// checkTiling requires the tensors' byte ranges to cover [0, dataLen)
// exactly once: an overlap means two tensors share bytes, a gap or tail
// means data no tensor accounts for, and both signal a damaged file.
func checkTiling(entries []entry, dataLen int64) error {
	sorted := append([]entry(nil), entries...)
	sort.Slice(sorted, func(i, j int) bool {
		a, b := sorted[i], sorted[j]
		if a.begin != b.begin {
			return a.begin < b.begin
		}
		if a.end != b.end {
			return a.end < b.end
		}
		return a.name < b.name
	})
	var pos int64
	prev := ""
	for _, e := range sorted {
		switch {
		case e.begin < pos:
			return fmt.Errorf("tensors %q and %q overlap: %q ends at byte %d but %q begins at %d", prev, e.name, prev, pos, e.name, e.begin)
		case e.begin > pos:
			return fmt.Errorf("data bytes [%d, %d) before tensor %q belong to no tensor", pos, e.begin, e.name)
		}
		if e.end > pos {
			pos, prev = e.end, e.name
		}
	}
	if pos != dataLen {
		return fmt.Errorf("data section has %d bytes but the tensors cover only %d: truncated header or trailing garbage", dataLen, pos)
	}
	return nil
}

// Reader reads single tensors of a safetensors file on demand: the header
// is validated once at Open, and each Read touches only that tensor's
// bytes, so a rank loads the few pieces it needs from a large file. A
// Reader is for one goroutine: its reads share one staging buffer of at
// most chunkElems elements, so reading a tensor of any size allocates no
// more than that outside the destination.
type Reader struct {
	path      string
	f         *os.File
	entries   map[string]entry
	dataStart int64
	raw       []byte // staging for ReadRange, reused
}

// Open opens path and validates its header.
func Open(path string) (*Reader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("ckpt: open %q: %w", path, err)
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("ckpt: open %q: %w", path, err)
	}
	entries, _, dataStart, err := readHeader(f, info.Size())
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("ckpt: open %q: %w", path, err)
	}
	r := &Reader{path: path, f: f, entries: map[string]entry{}, dataStart: dataStart}
	for _, e := range entries {
		r.entries[e.name] = e
	}
	return r, nil
}

// Close closes the file.
func (r *Reader) Close() error { return r.f.Close() }

// Numel is the element count of tensor name, or -1 when the file lacks it.
func (r *Reader) Numel(name string) int {
	e, ok := r.entries[name]
	if !ok {
		return -1
	}
	return e.numel
}

// Tensors describes every tensor of the file, by name, as Inspect does.
func (r *Reader) Tensors() map[string]Info {
	out := make(map[string]Info, len(r.entries))
	for name, e := range r.entries {
		out[name] = Info{DType: string(e.dt), Shape: e.shape}
	}
	return out
}

// Read fills dst (float32 or float64, as many elements as the stored
// tensor, any shape) with tensor name, converting from the stored dtype.
func (r *Reader) Read(name string, dst *tensor.Tensor) error {
	e, ok := r.entries[name]
	if !ok {
		return fmt.Errorf("ckpt: %s holds no tensor %q", r.path, name)
	}
	if e.numel != dst.Numel() {
		return fmt.Errorf("ckpt: tensor %q of %s has %d elements, not the %d expected", name, r.path, e.numel, dst.Numel())
	}
	return r.ReadRange(name, 0, e.numel, dst, 0)
}

// ReadRange fills elements [at, at+n) of dst (float32 or float64) with
// elements [from, from+n) of the stored tensor name (flattened row-major),
// converting from the stored dtype as Read does. Only those bytes are
// read: a rank loads the part of a tensor it holds, never the whole.
func (r *Reader) ReadRange(name string, from, n int, dst *tensor.Tensor, at int) error {
	e, ok := r.entries[name]
	if !ok {
		return fmt.Errorf("ckpt: %s holds no tensor %q", r.path, name)
	}
	if from < 0 || n < 0 || from+n > e.numel || at < 0 || at+n > dst.Numel() {
		return fmt.Errorf("ckpt: elements [%d, %d) of tensor %q of %s (%d elements) into [%d, %d) of %d", from, from+n, name, r.path, e.numel, at, at+n, dst.Numel())
	}
	var store any
	switch dst.DType() {
	case tensor.Float32:
		if e.dt == dtF64 || e.dt == dtI32 {
			return fmt.Errorf("ckpt: tensor %q of %s is %s, not float32", name, r.path, e.dt)
		}
		store = dst.F32()
	case tensor.Float64:
		if e.dt != dtF64 {
			return fmt.Errorf("ckpt: tensor %q of %s is %s, not float64", name, r.path, e.dt)
		}
		store = dst.F64()
	default:
		return fmt.Errorf("ckpt: cannot read into %s", dst)
	}
	es := int64(e.dt.size())
	if need := min(int64(n), chunkElems) * es; int64(cap(r.raw)) < need {
		r.raw = make([]byte, need)
	}
	raw := r.raw[:cap(r.raw)]
	for k := int64(0); k < int64(n); k += chunkElems {
		m := min(int64(n)-k, chunkElems)
		buf := raw[:m*es]
		if _, err := r.f.ReadAt(buf, r.dataStart+e.begin+(int64(from)+k)*es); err != nil {
			return fmt.Errorf("ckpt: tensor %q of %s: reading data: %w", name, r.path, err)
		}
		decode(e.dt, buf, store, at+int(k))
	}
	return nil
}
