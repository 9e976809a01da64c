package data

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// rawShard writes a shard header and tokens of the given width by hand, in
// llm.c's layout, with count as the header says.
func rawShard(t *testing.T, dir string, magic, version uint32, count int32, width int, tokens []uint32) string {
	b := make([]byte, HeaderBytes+len(tokens)*width)
	binary.LittleEndian.PutUint32(b[0:], magic)
	binary.LittleEndian.PutUint32(b[4:], version)
	binary.LittleEndian.PutUint32(b[8:], uint32(count))
	for i, tok := range tokens {
		if width == 2 {
			binary.LittleEndian.PutUint16(b[HeaderBytes+2*i:], uint16(tok))
		} else {
			binary.LittleEndian.PutUint32(b[HeaderBytes+4*i:], tok)
		}
	}
	p := filepath.Join(dir, fmt.Sprintf("shard_%d_%d_%d.bin", magic, version, count))
	require.NoError(t, os.WriteFile(p, b, 0o644))
	return p
}

func TestBadShardsAreRefusedNamingFileAndOffset(t *testing.T) {
	dir := t.TempDir()
	toks := make([]uint32, 100)
	cases := []struct {
		path, want string
	}{
		{rawShard(t, dir, 12345, 1, 100, 2, toks), "data: token shard %s: magic 12345 at offset 0 is not a token shard's (20240520 for uint16 tokens, 20240801 for uint32); set data.format=text to read it as text"},
		{rawShard(t, dir, MagicUint16, 7, 100, 2, toks), "data: token shard %s: version 7 at offset 4 does not go with magic 20240520 (want version 1)"},
		{rawShard(t, dir, MagicUint32, 1, 100, 4, toks), "data: token shard %s: version 1 at offset 4 does not go with magic 20240801 (want version 7)"},
		{rawShard(t, dir, MagicUint16, 1, 101, 2, toks), "data: token shard %s is 1224 bytes, but its header (offset 8) counts 101 tokens of 2 bytes: 1226 bytes expected"},
	}
	for _, c := range cases {
		_, err := OpenShard(c.path)
		require.EqualError(t, err, fmt.Sprintf(c.want, c.path))
	}
}

// An id at or above the vocabulary stops the read of the window holding
// it, naming the shard, the byte offset and the id; windows before it
// read fine: the loader's own guard, behind the scan at open
// (CheckVocab).
func TestShardIDAboveVocabNamedWhenRead(t *testing.T) {
	dir := t.TempDir()
	toks := make([]uint32, 200)
	for i := range toks {
		toks[i] = uint32(i % 50)
	}
	toks[150] = 50257
	p := rawShard(t, dir, MagicUint32, VersionUint32, 200, 4, toks)
	s, err := OpenShard(p)
	require.NoError(t, err)
	defer s.Close()
	l, err := NewSegmentLoader([]Segment{{shard: s, hi: s.Count}}, 16, Sequential, 1, 50257)
	require.NoError(t, err)
	l.Batch(0, 0, 0, 1, 4, 1) // windows 0..63
	require.NoError(t, l.Err())
	for step := 1; l.Err() == nil && step < 10; step++ {
		l.Batch(step, 0, 0, 1, 4, 1)
	}
	require.EqualError(t, l.Err(), fmt.Sprintf("data: token shard %s: token id 50257 at byte offset %d is not below model.vocab_size=50257: set model.vocab_size to the tokenizer's vocabulary (50257 for GPT-2)", p, HeaderBytes+150*4))
}

// Windows never cross a shard boundary, and the shards are read in
// sorted order whatever the glob returns.
func TestShardWindowsStayInsideShards(t *testing.T) {
	dir := t.TempDir()
	for i, name := range []string{"train_001.bin", "train_000.bin"} {
		toks := make([]int32, 40)
		for j := range toks {
			toks[j] = int32(100*i + j) // train_000 (written second) holds 100.., train_001 holds 0..
		}
		require.NoError(t, WriteShard(filepath.Join(dir, name), toks))
	}
	shards, err := OpenShards(filepath.Join(dir, "train_*.bin"))
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, "train_000.bin"), shards[0].Path)
	segs, _ := ShardSegments(shards, 0)
	l, err := NewSegmentLoader(segs, 8, Sequential, 1, 256)
	require.NoError(t, err)
	require.Equal(t, 80, l.Len())
	for g := int64(0); g < 40; g++ {
		x, y := l.Sample(g)
		require.Equal(t, x[0]/100, y[len(y)-1]/100, "window %d crosses shards: %v %v", g, x, y)
		require.Equal(t, x[1:], y[:len(y)-1])
	}
	x, _ := l.Sample(0)
	require.Equal(t, int32(100), x[0], "train_000 first")
}

// BenchmarkShardLoaderRandom reads random windows (B=8, T=1024) from
// sparse shards larger than memory (6 × 4 GiB of uint16 tokens), the
// access pattern of data.order=random; it reports tokens/s.
func BenchmarkShardLoaderRandom(b *testing.B) {
	dir := b.TempDir()
	const per = int64(1<<31 - 1)
	for i := 0; i < 6; i++ {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("big_%03d.bin", i)))
		require.NoError(b, err)
		var h [HeaderBytes]byte
		binary.LittleEndian.PutUint32(h[0:], MagicUint16)
		binary.LittleEndian.PutUint32(h[4:], VersionUint16)
		binary.LittleEndian.PutUint32(h[8:], uint32(per))
		_, err = f.Write(h[:])
		require.NoError(b, err)
		require.NoError(b, f.Truncate(HeaderBytes+2*per))
		require.NoError(b, f.Close())
	}
	shards, err := OpenShards(filepath.Join(dir, "big_*.bin"))
	require.NoError(b, err)
	segs, _ := ShardSegments(shards, 0)
	l, err := NewSegmentLoader(segs, 1024, Random, 1, 50257)
	require.NoError(b, err)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		l.Batch(i, 0, 0, 1, 8, 1)
	}
	b.ReportMetric(float64(b.N*8*1024)/b.Elapsed().Seconds(), "tokens/s")
}

// CheckVocab finds an id at or above the vocabulary in one pass when the
// shard is opened, naming the shard, the byte offset and the id, in both
// widths; a sparse shard (holes read as token 0) passes without its holes
// being read.
func TestShardIDAboveVocabFoundAtOpen(t *testing.T) {
	dir := t.TempDir()
	for _, width := range []int{2, 4} {
		toks := make([]uint32, 3000)
		for i := range toks {
			toks[i] = uint32(i % 256)
		}
		toks[2999] = 300
		magic, version := uint32(MagicUint16), uint32(VersionUint16)
		if width == 4 {
			magic, version = MagicUint32, VersionUint32
		}
		p := rawShard(t, dir, magic, version, 3000, width, toks)
		s, err := OpenShard(p)
		require.NoError(t, err)
		require.EqualError(t, s.CheckVocab(256), fmt.Sprintf("data: token shard %s: token id 300 at byte offset %d is not below model.vocab_size=256: set model.vocab_size to the tokenizer's vocabulary (50257 for GPT-2)", p, HeaderBytes+2999*width))
		require.NoError(t, s.CheckVocab(301))
		require.NoError(t, s.Close())
	}

	// 1 GiB of tokens, a hole but for a bad id near its end and one near
	// its start.
	p := filepath.Join(dir, "sparse.bin")
	const count = 1 << 29
	f, err := os.Create(p)
	require.NoError(t, err)
	var h [HeaderBytes]byte
	binary.LittleEndian.PutUint32(h[0:], MagicUint16)
	binary.LittleEndian.PutUint32(h[4:], VersionUint16)
	binary.LittleEndian.PutUint32(h[8:], count)
	_, err = f.Write(h[:])
	require.NoError(t, err)
	require.NoError(t, f.Truncate(HeaderBytes+2*count))
	_, err = f.WriteAt([]byte{7, 0}, HeaderBytes+2*10)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte{0xff, 0xff}, HeaderBytes+2*(count-3))
	require.NoError(t, err)
	require.NoError(t, f.Close())
	s, err := OpenShard(p)
	require.NoError(t, err)
	defer s.Close()
	require.EqualError(t, s.CheckVocab(50257), fmt.Sprintf("data: token shard %s: token id 65535 at byte offset %d is not below model.vocab_size=50257: set model.vocab_size to the tokenizer's vocabulary (50257 for GPT-2)", p, HeaderBytes+2*(count-3)))
}

// A device or a pipe is refused as data before anything is read: it may
// have no end (data.max_bytes=0 would read it for ever).
func TestDevicesAndPipesAreRefused(t *testing.T) {
	const tail = ", not a regular file or a directory: point it at a text file, a directory of text files or token shards (a device or a pipe may have no end, and data.max_bytes=0 means no cap: every byte is read)"
	_, err := LoadCorpus("/dev/zero", 0)
	require.EqualError(t, err, `data: data.path "/dev/zero" is a character device`+tail)
	fifo := filepath.Join(t.TempDir(), "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	_, err = LoadCorpus(fifo, 0) // would block on open if it got that far
	require.EqualError(t, err, `data: data.path "`+fifo+`" is a named pipe`+tail)
	require.EqualError(t, CheckPath("data.val_path", filepath.Dir(fifo)+"/f*"), `data: data.val_path "`+fifo+`" is a named pipe`+tail)
	_, err = OpenShards("/dev/zero")
	require.EqualError(t, err, "data: token shard /dev/zero is a character device, not a regular file: a shard is a file written by tinyacc tokenize or llm.c")
	require.NoError(t, CheckPath("data.path", t.TempDir()))
}
