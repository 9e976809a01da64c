package data

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"syscall"
)

// Token shards in llm.c's layout: a header of 256 little-endian int32 (the
// magic, the version, the token count, the rest zero), then the tokens,
// uint16 for GPT-2's vocabulary (magic 20240520, version 1) or uint32 for
// larger ones (magic 20240801, version 7). A file must be exactly
// HeaderBytes + count × token size long.
const (
	HeaderBytes   = 256 * 4
	MagicUint16   = 20240520
	VersionUint16 = 1
	MagicUint32   = 20240801
	VersionUint32 = 7
)

// Shard is one memory-mapped token file. Its pages are the kernel's: a
// shard larger than memory costs only the pages the windows touch.
type Shard struct {
	Path  string
	Count int64 // tokens
	Width int   // bytes per token: 2 or 4
	data  []byte
}

// Token returns token i of the shard.
func (s *Shard) Token(i int64) uint32 {
	o := HeaderBytes + i*int64(s.Width)
	if s.Width == 2 {
		return uint32(binary.LittleEndian.Uint16(s.data[o:]))
	}
	return binary.LittleEndian.Uint32(s.data[o:])
}

// Close unmaps the shard.
func (s *Shard) Close() error {
	if s.data == nil {
		return nil
	}
	err := syscall.Munmap(s.data)
	s.data = nil
	return err
}

// IsShardFile reports whether path starts with a shard header's magic.
func IsShardFile(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	var b [4]byte
	if _, err := f.Read(b[:]); err != nil {
		return false
	}
	m := binary.LittleEndian.Uint32(b[:])
	return m == MagicUint16 || m == MagicUint32
}

// OpenShard maps one shard after checking its header and size, naming the
// file, the offset and what was found on any mismatch.
func OpenShard(path string) (*Shard, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("data: token shard: %w", err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("data: token shard: %w", err)
	}
	if m := info.Mode(); !m.IsRegular() {
		return nil, fmt.Errorf("data: token shard %s is %s, not a regular file: a shard is a file written by tinyacc tokenize or llm.c", path, modeName(m))
	}
	if info.Size() < HeaderBytes {
		return nil, fmt.Errorf("data: token shard %s is %d bytes, shorter than the %d-byte header", path, info.Size(), HeaderBytes)
	}
	var head [12]byte
	if _, err := f.ReadAt(head[:], 0); err != nil {
		return nil, fmt.Errorf("data: token shard %s: reading the header: %w", path, err)
	}
	magic := binary.LittleEndian.Uint32(head[0:])
	version := binary.LittleEndian.Uint32(head[4:])
	count := int64(int32(binary.LittleEndian.Uint32(head[8:])))
	width := 0
	switch {
	case magic == MagicUint16 && version == VersionUint16:
		width = 2
	case magic == MagicUint32 && version == VersionUint32:
		width = 4
	case magic == MagicUint16 || magic == MagicUint32:
		want := map[uint32]int{MagicUint16: VersionUint16, MagicUint32: VersionUint32}[magic]
		return nil, fmt.Errorf("data: token shard %s: version %d at offset 4 does not go with magic %d (want version %d)", path, version, magic, want)
	default:
		return nil, fmt.Errorf("data: token shard %s: magic %d at offset 0 is not a token shard's (%d for uint16 tokens, %d for uint32); set data.format=text to read it as text", path, magic, MagicUint16, MagicUint32)
	}
	if want := HeaderBytes + count*int64(width); count < 0 || info.Size() != want {
		return nil, fmt.Errorf("data: token shard %s is %d bytes, but its header (offset 8) counts %d tokens of %d bytes: %d bytes expected", path, info.Size(), count, width, want)
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(info.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("data: token shard %s: mapping it: %w", path, err)
	}
	return &Shard{Path: path, Count: count, Width: width, data: data}, nil
}

// CheckVocab reads the shard's tokens once and reports the first that is
// not below vocab, naming the file, its byte offset and the id, so a shard
// written for a larger vocabulary is refused when it is opened rather than
// at the step whose window meets the token. It reads through a small buffer
// (the mapping's pages would count as the process's memory) and skips the
// holes of a sparse file, which hold token 0.
func (s *Shard) CheckVocab(vocab int) error {
	f, err := os.Open(s.Path)
	if err != nil {
		return fmt.Errorf("data: token shard: %w", err)
	}
	defer f.Close()
	end := HeaderBytes + s.Count*int64(s.Width)
	buf := make([]byte, 1<<20)
	for at := int64(HeaderBytes); at < end; {
		if d, err := f.Seek(at, seekData); err == nil && d > at {
			at = d - (d-HeaderBytes)%int64(s.Width) // a hole reads as zeros
			if at >= end {
				break
			}
		} else if err != nil && errors.Is(err, syscall.ENXIO) {
			break // only a hole is left
		}
		n, err := f.ReadAt(buf[:min(int64(len(buf)), end-at)], at)
		if n == 0 && err != nil {
			return fmt.Errorf("data: token shard %s: reading tokens at byte offset %d: %w", s.Path, at, err)
		}
		n -= n % s.Width
		for i := 0; i < n; i += s.Width {
			var id uint32
			if s.Width == 2 {
				id = uint32(binary.LittleEndian.Uint16(buf[i:]))
			} else {
				id = binary.LittleEndian.Uint32(buf[i:])
			}
			if id >= uint32(vocab) {
				return fmt.Errorf("data: token shard %s: token id %d at byte offset %d is not below model.vocab_size=%d: set model.vocab_size to the tokenizer's vocabulary (50257 for GPT-2)",
					s.Path, id, at+int64(i), vocab)
			}
		}
		at += int64(n)
	}
	return nil
}

// seekData is lseek's SEEK_DATA: the next offset at or after the given one
// that holds data rather than a hole.
const seekData = 3

// OpenShards maps every shard a path or glob names, in sorted order.
func OpenShards(pattern string) ([]*Shard, error) {
	files, err := filepath.Glob(pattern)
	if err != nil {
		return nil, fmt.Errorf("data: data.path %q is not a valid glob: %w", pattern, err)
	}
	if len(files) == 0 {
		if _, err := os.Stat(pattern); errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("data: data.path %q names no file", pattern)
		}
		files = []string{pattern}
	}
	sort.Strings(files)
	var out []*Shard
	for _, f := range files {
		s, err := OpenShard(f)
		if err != nil {
			for _, o := range out {
				o.Close()
			}
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// WriteShard writes tokens as a shard: uint16 (magic 20240520) when every
// id fits, uint32 (magic 20240801) otherwise.
func WriteShard(path string, tokens []int32) error {
	width, magic, version := 2, uint32(MagicUint16), uint32(VersionUint16)
	for _, t := range tokens {
		if t < 0 {
			return fmt.Errorf("data: token %d is negative", t)
		}
		if t > 0xFFFF {
			width, magic, version = 4, MagicUint32, VersionUint32
			break
		}
	}
	buf := make([]byte, HeaderBytes+len(tokens)*width)
	binary.LittleEndian.PutUint32(buf[0:], magic)
	binary.LittleEndian.PutUint32(buf[4:], version)
	binary.LittleEndian.PutUint32(buf[8:], uint32(len(tokens)))
	for i, t := range tokens {
		o := HeaderBytes + i*width
		if width == 2 {
			binary.LittleEndian.PutUint16(buf[o:], uint16(t))
		} else {
			binary.LittleEndian.PutUint32(buf[o:], uint32(t))
		}
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, buf, 0o644); err != nil {
		return fmt.Errorf("data: writing shard: %w", err)
	}
	return os.Rename(tmp, path)
}

// Segment is a contiguous run of tokens that windows never cross: a whole
// text corpus, or (part of) one shard.
type Segment struct {
	tokens []int32 // a text corpus's tokens, or nil
	shard  *Shard
	lo, hi int64 // the segment is tokens [lo, hi) of the shard
}

// TextSegment is a segment over in-memory tokens.
func TextSegment(tokens []int32) Segment {
	return Segment{tokens: tokens, hi: int64(len(tokens))}
}

// ShardSegments splits the token stream of shards into training segments
// (all but the last valFraction of the tokens) and validation segments
// (that last part), as Split does for text.
func ShardSegments(shards []*Shard, valFraction float64) (train, val []Segment) {
	var total int64
	for _, s := range shards {
		total += s.Count
	}
	cut := total - int64(float64(total)*valFraction)
	var at int64
	for _, s := range shards {
		lo, hi := at, at+s.Count
		at = hi
		if lo < cut {
			train = append(train, Segment{shard: s, lo: 0, hi: min(hi, cut) - lo})
		}
		if hi > cut {
			val = append(val, Segment{shard: s, lo: max(lo, cut) - lo, hi: s.Count})
		}
	}
	return train, val
}

func (s Segment) len() int64 { return s.hi - s.lo }
