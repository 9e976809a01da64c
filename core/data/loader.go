package data

import (
	"fmt"
	"math/bits"
	"slices"
	"sort"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// Orders a Loader understands.
const (
	// Sequential walks the stream in consecutive, non-overlapping windows,
	// wrapping around at the end.
	Sequential = "sequential"
	// Random draws each window's offset from a hash of (seed, sample index).
	Random = "random"
)

// Loader cuts a token stream into (input, target) windows of T tokens. Every
// sample is a pure function of its global index (and, for random order, the
// seed), with no state carried between calls. That is what makes data
// parallelism and gradient accumulation exact: any rank can compute any
// sample, so N ranks taking disjoint slices of a global batch together see
// precisely what a single process sees.
type Loader struct {
	segs   []Segment
	starts []uint64 // starts[i]: the first window index of segs[i]; starts[len] = span
	t      int
	order  string
	seed   int64
	span   uint64 // number of valid start offsets over all segments
	length int64  // tokens over all segments
	vocab  int    // ids must be below it (0: unchecked)
	err    error  // the first bad token id a window met
	cols   []int  // the positions of each window batches keep (nil: all)
}

// NewLoader builds a loader over tokens with block size T. order is
// "sequential" or "random"; seed only matters for random order.
func NewLoader(tokens []int32, T int, order string, seed int64) (*Loader, error) {
	return NewSegmentLoader([]Segment{TextSegment(tokens)}, T, order, seed, 0)
}

// NewSegmentLoader builds a loader over segments (token shards) that no
// window crosses, as llm.c never lets a sequence span two shards: segment
// i offers len_i − T − 1 window starts, numbered after those of the
// segments before it. A segment too short for one window offers none.
// vocab > 0 makes reading a window with an id >= vocab an error (Err):
// the last guard, as the trainer scans each shard when it opens it
// (Shard.CheckVocab).
func NewSegmentLoader(segs []Segment, T int, order string, seed int64, vocab int) (*Loader, error) {
	if T <= 0 {
		return nil, fmt.Errorf("data: block size %d must be positive: set model.block_size >= 1", T)
	}
	if order != Sequential && order != Random {
		return nil, fmt.Errorf("data: data.order=%q is not supported: use %q or %q", order, Sequential, Random)
	}
	l := &Loader{t: T, order: order, seed: seed, vocab: vocab}
	for _, sg := range segs {
		l.length += sg.len()
		if sg.len() < int64(T)+2 {
			continue
		}
		l.segs = append(l.segs, sg)
		l.starts = append(l.starts, l.span)
		l.span += uint64(sg.len() - int64(T) - 1)
	}
	l.starts = append(l.starts, l.span)
	if l.span == 0 {
		if len(segs) > 1 {
			return nil, fmt.Errorf("data: no token shard holds block_size+2 = %d tokens (%d tokens in %d segments); use larger shards or a smaller model.block_size", T+2, l.length, len(segs))
		}
		return nil, fmt.Errorf("data: corpus is too short for block_size: %d tokens, need at least block_size+2 = %d; use more text (data.path, data.max_bytes), a smaller model.block_size, or a smaller data.val_fraction", l.length, T+2)
	}
	return l, nil
}

// Err is the first bad token id a window met (naming the shard, the byte
// offset and the id), nil while every id was below the vocabulary.
func (l *Loader) Err() error { return l.err }

// BlockSize is T, the length of each window.
func (l *Loader) BlockSize() int { return l.t }

// Len is the number of tokens in the stream.
func (l *Loader) Len() int { return int(l.length) }

// Order is "sequential" or "random".
func (l *Loader) Order() string { return l.order }

// Offset is where sample globalIndex starts: (index·T) mod (L−T−1) in
// sequential order, a uniform hash of (seed, index) in [0, L−T−1) in random
// order.
func (l *Loader) Offset(globalIndex int64) int {
	if globalIndex < 0 {
		panic(fmt.Sprintf("data: negative sample index %d", globalIndex))
	}
	if l.order == Random {
		return l.randomOffset(uint64(globalIndex))
	}
	return l.seqOffset(uint64(globalIndex))
}

// seqOffset computes (g·T) mod span exactly for any g: the 128-bit product
// cannot overflow, so a long run never wraps to a wrong offset.
func (l *Loader) seqOffset(g uint64) int {
	hi, lo := bits.Mul64(g, uint64(l.t))
	return int(bits.Rem64(hi, lo, l.span))
}

// randomOffset maps the hashed index onto [0, span) with a 64x64 multiply
// (the high word), whose bias is below span/2^64 and so immaterial.
func (l *Loader) randomOffset(g uint64) int {
	h := splitmix64(splitmix64(uint64(l.seed)^0x5851F42D4C957F2D) + g*0x9E3779B97F4A7C15)
	hi, _ := bits.Mul64(h, l.span)
	return int(hi)
}

// splitmix64 is the finaliser of the SplitMix64 generator: a bijective mix of
// 64 bits with good avalanche, enough to turn consecutive indices into
// independent-looking offsets.
func splitmix64(x uint64) uint64 {
	x += 0x9E3779B97F4A7C15
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
	x = (x ^ (x >> 27)) * 0x94D049BB133111EB
	return x ^ (x >> 31)
}

// Sample returns the window of sample globalIndex: x = tokens[o:o+T] and the
// next-token targets y = tokens[o+1:o+T+1]. Over text both alias the
// loader's stream and must not be modified.
func (l *Loader) Sample(globalIndex int64) (x, y []int32) {
	sg, o := l.locate(l.Offset(globalIndex))
	if sg.tokens != nil {
		return sg.tokens[o : o+l.t], sg.tokens[o+1 : o+l.t+1]
	}
	w := make([]int32, l.t+1)
	l.read(sg, o, w)
	return w[:l.t], w[1:]
}

// locate maps a window start (numbered over all segments) to its segment
// and the start inside it.
func (l *Loader) locate(o int) (Segment, int) {
	if len(l.segs) == 1 {
		return l.segs[0], int(l.segs[0].lo) + o
	}
	i := sort.Search(len(l.segs), func(i int) bool { return l.starts[i+1] > uint64(o) }) // the segment holding o
	return l.segs[i], int(l.segs[i].lo + int64(uint64(o)-l.starts[i]))
}

// read copies len(dst) tokens of sg from o, checking shard ids against
// the vocabulary.
func (l *Loader) read(sg Segment, o int, dst []int32) {
	if sg.tokens != nil {
		copy(dst, sg.tokens[o:])
		return
	}
	for j := range dst {
		id := sg.shard.Token(int64(o + j))
		if l.vocab > 0 && id >= uint32(l.vocab) {
			if l.err == nil {
				l.err = fmt.Errorf("data: token shard %s: token id %d at byte offset %d is not below model.vocab_size=%d: set model.vocab_size to the tokenizer's vocabulary (50257 for GPT-2)",
					sg.shard.Path, id, HeaderBytes+int64(o+j)*int64(sg.shard.Width), l.vocab)
			}
			id = 0 // the step is refused through Err; keep the index in range
		}
		dst[j] = int32(id)
	}
}

// Batch returns micro-batch micro of data-parallel rank rank for training step
// step, as int32 tensors of shape [B, T]. The step's global batch has
// G = B·A·N samples (A = grad-accum steps, N = nranks); micro-batch a of rank r
// holds samples a·N·B + r·B + j for j < B. Interleaving ranks inside each
// micro-batch (rather than giving each rank a contiguous block) means the
// samples consumed after a micro-batches are the same whatever N is.
func (l *Loader) Batch(step, micro, rank, nranks, B, A int) (x, y *tensor.Tensor) {
	first := sliceStart("Batch", "step", step, micro, rank, nranks, B, A)
	return l.gather(func(j int) int { return l.Offset(first + int64(j)) }, B)
}

// EvalBatch returns micro-batch micro of data-parallel rank rank in global
// evaluation batch k, cut from the global batch exactly as Batch cuts a
// step's: the G = B·A·N windows of batch k are consecutive and
// non-overlapping, window i starting at (k·G + i)·T mod (L−T−1) whatever
// the loader's order, so evaluation measures the same text every time, and
// the same text on every layout of the same global batch.
func (l *Loader) EvalBatch(k, micro, rank, nranks, B, A int) (x, y *tensor.Tensor) {
	first := uint64(sliceStart("EvalBatch", "k", k, micro, rank, nranks, B, A))
	return l.gather(func(j int) int { return l.seqOffset(first + uint64(j)) }, B)
}

// sliceStart is the global index of the first sample of micro-batch micro
// of rank rank in global batch k (a step, or an evaluation batch) of
// G = B·A·N samples: k·G + micro·N·B + rank·B. It panics on arguments
// outside their ranges, naming the caller fn and its batch index kName.
func sliceStart(fn, kName string, k, micro, rank, nranks, B, A int) int64 {
	if k < 0 || B <= 0 || A <= 0 || nranks <= 0 || micro < 0 || micro >= A || rank < 0 || rank >= nranks {
		panic(fmt.Sprintf("data: %s(%s=%d, micro=%d, rank=%d, nranks=%d, B=%d, A=%d): need %s>=0, B,A,nranks>=1, 0<=micro<A, 0<=rank<nranks",
			fn, kName, k, micro, rank, nranks, B, A, kName))
	}
	G := int64(B) * int64(A) * int64(nranks)
	return int64(k)*G + int64(micro)*int64(nranks)*int64(B) + int64(rank)*int64(B)
}

// KeepColumns makes Batch and EvalBatch return only the given positions of
// every window, in the order given: [B, len(cols)] inputs and the targets
// at the same positions. A context-parallel rank keeps its chunks of every
// sequence this way, reading the same windows as the rest of its group.
// nil keeps every position.
func (l *Loader) KeepColumns(cols []int) error {
	for _, c := range cols {
		if c < 0 || c >= l.t {
			return fmt.Errorf("data: column %d is outside a window of block_size %d", c, l.t)
		}
	}
	l.cols = slices.Clone(cols)
	return nil
}

// gather copies B windows into fresh [B, T] tensors (T: the kept columns);
// fresh buffers keep the batch independent of the stream, so callers may
// keep or mutate it.
func (l *Loader) gather(offset func(j int) int, B int) (x, y *tensor.Tensor) {
	T := l.t
	if l.cols != nil {
		T = len(l.cols)
	}
	xs := make([]int32, B*T)
	ys := make([]int32, B*T)
	w := make([]int32, l.t+1)
	for j := 0; j < B; j++ {
		sg, o := l.locate(offset(j))
		l.read(sg, o, w)
		if l.cols == nil {
			copy(xs[j*T:(j+1)*T], w[:T])
			copy(ys[j*T:(j+1)*T], w[1:])
			continue
		}
		for i, c := range l.cols {
			xs[j*T+i], ys[j*T+i] = w[c], w[c+1]
		}
	}
	return tensor.FromI32(xs, B, T), tensor.FromI32(ys, B, T)
}
