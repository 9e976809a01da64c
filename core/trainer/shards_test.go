package trainer

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/data"
)

func trainLosses(t *testing.T, cfgEdit func(c *config.Config)) ([]float64, *Result) {
	cfg := smallConfig()
	cfg.Train.EvalEvery = 0
	cfgEdit(&cfg)
	var out []float64
	tr, err := New(cfg, Options{OnStep: func(m StepMetrics) { out = append(out, m.Loss) }})
	require.NoError(t, err)
	res, err := tr.Run(context.Background())
	require.NoError(t, err)
	return out, res
}

// A shard written from a text file with the byte tokenizer trains to the
// very losses of the text (same windows, same order), in both orders.
func TestTokenizedShardTrainsLikeItsText(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "corpus.txt")
	require.NoError(t, os.WriteFile(text, []byte(strings.Repeat(refText, 20)), 0o644))
	raw, err := os.ReadFile(text)
	require.NoError(t, err)
	shard := filepath.Join(dir, "corpus.bin")
	require.NoError(t, data.WriteShard(shard, data.EncodeBytes(raw)))
	for _, order := range []string{"sequential", "random"} {
		fromText, _ := trainLosses(t, func(c *config.Config) { c.Data.Path, c.Data.ValFraction, c.Data.Order = text, 0, order })
		fromShard, _ := trainLosses(t, func(c *config.Config) { c.Data.Path, c.Data.ValFraction, c.Data.Order = shard, 0, order })
		require.Equal(t, fromText, fromShard, order)
		forced, _ := trainLosses(t, func(c *config.Config) {
			c.Data.Path, c.Data.ValFraction, c.Data.Order, c.Data.Format = shard, 0, order, "tokens"
		})
		require.Equal(t, fromText, forced, order)
	}
}

// writeLLMCShard writes a shard as llm.c's tokenizer scripts do: 256
// int32 of header (magic 20240520, version 1, count), uint16 GPT-2 ids.
func writeLLMCShard(t *testing.T, path string, n int) {
	b := make([]byte, 1024+2*n)
	binary.LittleEndian.PutUint32(b[0:], 20240520)
	binary.LittleEndian.PutUint32(b[4:], 1)
	binary.LittleEndian.PutUint32(b[8:], uint32(n))
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint16(b[1024+2*i:], uint16((i*7919)%50257))
	}
	require.NoError(t, os.WriteFile(path, b, 0o644))
}

// Shards in llm.c's layout with GPT-2's vocabulary train, with separate
// validation shards.
func TestLLMCShardsTrain(t *testing.T) {
	dir := t.TempDir()
	writeLLMCShard(t, filepath.Join(dir, "fineweb_train_000001.bin"), 3000)
	writeLLMCShard(t, filepath.Join(dir, "fineweb_train_000002.bin"), 3000)
	writeLLMCShard(t, filepath.Join(dir, "fineweb_val_000000.bin"), 1000)
	losses, res := trainLosses(t, func(c *config.Config) {
		c.Model.VocabSize = 50257
		c.Data.Path = filepath.Join(dir, "fineweb_train_*.bin")
		c.Data.ValPath = filepath.Join(dir, "fineweb_val_*.bin")
		c.Train.Steps = 3
	})
	require.Len(t, losses, 3)
	require.Equal(t, 3, res.LastEval.Step, "one evaluation, after the last step")
	require.InDelta(t, 10.8, losses[0], 0.5, "about ln(50257) at the start")
}

// Sparse shards together larger than this machine's memory train a few
// steps: the shards are mapped, never read whole.
func TestShardsLargerThanMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("writes sparse files")
	}
	dir := t.TempDir()
	mem := physicalMemory(t)
	const perShard = int64(1<<31 - 1) // the header's int32 count: 4 GiB of uint16 each
	n := int(mem/(2*perShard)) + 1
	for i := 0; i < n; i++ {
		p := filepath.Join(dir, fmt.Sprintf("big_%03d.bin", i))
		f, err := os.Create(p)
		require.NoError(t, err)
		var h [1024]byte
		binary.LittleEndian.PutUint32(h[0:], data.MagicUint16)
		binary.LittleEndian.PutUint32(h[4:], data.VersionUint16)
		binary.LittleEndian.PutUint32(h[8:], uint32(perShard))
		_, err = f.Write(h[:])
		require.NoError(t, err)
		require.NoError(t, f.Truncate(1024+2*perShard)) // a hole: token 0 everywhere
		require.NoError(t, f.Close())
	}
	_, res := trainLosses(t, func(c *config.Config) {
		c.Data.Path = filepath.Join(dir, "big_*.bin")
		c.Data.Order = "random"
		c.Train.Steps = 3
	})
	require.Equal(t, 3, res.StepsRun)
	require.Less(t, res.Memory[0].RSSPeakBytes, int64(1<<30), "%d shards of %d tokens against %d bytes of memory", n, perShard, mem)
}

func physicalMemory(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/meminfo")
	require.NoError(t, err)
	var kb int64
	_, err = fmt.Sscanf(strings.SplitN(string(b), "\n", 2)[0], "MemTotal: %d kB", &kb)
	require.NoError(t, err)
	return kb << 10
}

// A token at or beyond model.vocab_size is found when the shard is opened,
// before the first step, not at the step whose window meets it; a device
// as data.path is refused by the estimate that runs before any work.
func TestBadDataRefusedBeforeTraining(t *testing.T) {
	dir := t.TempDir()
	toks := data.EncodeBytes([]byte(strings.Repeat(refText, 20)))
	toks[len(toks)-5] = 256
	shard := filepath.Join(dir, "bad.bin")
	require.NoError(t, data.WriteShard(shard, toks))
	cfg := smallConfig()
	cfg.Data.Path = shard
	_, err := New(cfg, Options{})
	require.EqualError(t, err, fmt.Sprintf("data: token shard %s: token id 256 at byte offset %d is not below model.vocab_size=256: set model.vocab_size to the tokenizer's vocabulary (50257 for GPT-2)", shard, data.HeaderBytes+2*(len(toks)-5)))

	cfg.Data.Path, cfg.Data.MaxBytes = "/dev/zero", 0
	_, err = EstimateMemory(cfg, 1, 1, nil)
	require.EqualError(t, err, `data: data.path "/dev/zero" is a character device, not a regular file or a directory: point it at a text file, a directory of text files or token shards (a device or a pipe may have no end, and data.max_bytes=0 means no cap: every byte is read)`)
}
