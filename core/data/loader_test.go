package data

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// stream returns tokens 0..n-1 (mod 2^31), so a window's first token is its
// offset and windows are easy to identify.
func stream(n int) []int32 {
	s := make([]int32, n)
	for i := range s {
		s[i] = int32(i)
	}
	return s
}

func TestNewLoaderErrors(t *testing.T) {
	_, err := NewLoader(stream(9), 8, Sequential, 0)
	require.EqualError(t, err, "data: corpus is too short for block_size: 9 tokens, need at least block_size+2 = 10; use more text (data.path, data.max_bytes), a smaller model.block_size, or a smaller data.val_fraction")
	_, err = NewLoader(stream(100), 8, "shuffled", 0)
	require.EqualError(t, err, `data: data.order="shuffled" is not supported: use "sequential" or "random"`)
	_, err = NewLoader(stream(100), 0, Sequential, 0)
	require.EqualError(t, err, "data: block size 0 must be positive: set model.block_size >= 1")
	l, err := NewLoader(stream(10), 8, Sequential, 0)
	require.NoError(t, err, "L = T+2 is the smallest usable stream")
	assert.Equal(t, 8, l.BlockSize())
	assert.Equal(t, 10, l.Len())
}

// TestSequentialFormula holds Batch against a direct transcription of
// o = ((s·G + i)·T) mod (L − T − 1), including indices that wrap around.
func TestSequentialFormula(t *testing.T) {
	const L, T = 103, 7 // span 95, not a multiple of T, so wrapped windows shift
	tokens := stream(L)
	l, err := NewLoader(tokens, T, Sequential, 42)
	require.NoError(t, err)
	B, A, N := 3, 2, 2
	G := B * A * N
	wrapped := false
	for s := 0; s < 20; s++ {
		for a := 0; a < A; a++ {
			for r := 0; r < N; r++ {
				x, y := l.Batch(s, a, r, N, B, A)
				require.Equal(t, []int{B, T}, x.Shape())
				require.Equal(t, []int{B, T}, y.Shape())
				for j := 0; j < B; j++ {
					i := a*N*B + r*B + j
					o := ((s*G + i) * T) % (L - T - 1)
					if (s*G+i)*T >= L-T-1 {
						wrapped = true
					}
					assert.Equal(t, tokens[o:o+T], x.I32()[j*T:(j+1)*T], "s=%d i=%d", s, i)
					assert.Equal(t, tokens[o+1:o+T+1], y.I32()[j*T:(j+1)*T], "s=%d i=%d", s, i)
				}
			}
		}
	}
	assert.True(t, wrapped, "the test must reach wrap-around")

	// A few spot values computed by hand: span = 95.
	for _, c := range []struct{ g, o int64 }{{0, 0}, {1, 7}, {13, 91}, {14, 3}, {95, 0}, {1 << 40, (1 << 40) * 7 % 95}} {
		assert.Equal(t, int(c.o), l.Offset(c.g), "index %d", c.g)
	}
	x, y := l.Sample(14)
	assert.Equal(t, tokens[3:10], x)
	assert.Equal(t, tokens[4:11], y)
}

func TestSequentialHugeIndexDoesNotOverflow(t *testing.T) {
	l, err := NewLoader(stream(1000), 10, Sequential, 0)
	require.NoError(t, err)
	// g·T overflows int64; the exact residue is (g mod 989)·10 mod 989.
	g := int64(1) << 62
	want := int((uint64(g) % 989) * 10 % 989)
	assert.Equal(t, want, l.Offset(g))
}

// globalBatch is what one process (N=1, A=1) sees at step s: samples
// s·G ... s·G+G-1 in order, flattened.
func globalBatch(l *Loader, s, G int) (xs, ys []int32) {
	for i := 0; i < G; i++ {
		x, y := l.Sample(int64(s*G + i))
		xs = append(xs, x...)
		ys = append(ys, y...)
	}
	return xs, ys
}

// concat joins the slices batch cuts global batch k into, micro-batch
// outer and rank inner.
func concat(batch func(k, micro, rank, nranks, B, A int) (x, y *tensor.Tensor), k, N, B, A int) (xs, ys []int32) {
	for a := 0; a < A; a++ {
		for r := 0; r < N; r++ {
			x, y := batch(k, a, r, N, B, A)
			xs, ys = append(xs, x.I32()...), append(ys, y.I32()...)
		}
	}
	return xs, ys
}

func TestRankMicroDecomposition(t *testing.T) {
	const T, B = 5, 2
	for _, order := range []string{Sequential, Random} {
		l, err := NewLoader(stream(211), T, order, 7)
		require.NoError(t, err)
		for _, N := range []int{1, 2, 4} {
			for _, A := range []int{1, 3} {
				G := B * A * N
				for s := 0; s < 4; s++ {
					// Concatenated in the stated order, the slices must be
					// exactly the single-process batch.
					xs, ys := concat(l.Batch, s, N, B, A)
					wx, wy := globalBatch(l, s, G)
					require.Equal(t, wx, xs, "order=%s N=%d A=%d s=%d", order, N, A, s)
					require.Equal(t, wy, ys, "order=%s N=%d A=%d s=%d", order, N, A, s)
					// And a single call with the whole batch as one micro-batch.
					x, _ := l.Batch(s, 0, 0, 1, G, 1)
					require.Equal(t, wx, x.I32())
				}
			}
		}
	}
}

func TestRandomOrder(t *testing.T) {
	const L, T = 5000, 16
	span := L - T - 1
	a, err := NewLoader(stream(L), T, Random, 1)
	require.NoError(t, err)
	a2, err := NewLoader(stream(L), T, Random, 1)
	require.NoError(t, err)
	b, err := NewLoader(stream(L), T, Random, 2)
	require.NoError(t, err)

	const n = 20000
	same, distinctSeeds := 0, 0
	seen := map[int]bool{}
	hist := make([]int, 10)
	for g := int64(0); g < n; g++ {
		o := a.Offset(g)
		require.True(t, o >= 0 && o < span, "offset %d out of [0,%d)", o, span)
		require.Equal(t, o, a2.Offset(g), "same seed, same index, same offset")
		if o == b.Offset(g) {
			same++
		}
		if o != int(g)*T%span {
			distinctSeeds++
		}
		seen[o] = true
		hist[o*10/span]++
		x, y := a.Sample(g)
		require.Equal(t, int32(o), x[0])
		require.Equal(t, int32(o+1), y[0])
	}
	// Seeds 1 and 2 agree only by chance (expected n/span = 4 times).
	assert.Less(t, same, 40)
	assert.Greater(t, distinctSeeds, n/2, "random order differs from sequential")
	// Coverage and rough uniformity: each tenth of the range gets n/10 ± 10%.
	assert.Greater(t, len(seen), span*9/10)
	for k, c := range hist {
		assert.InDelta(t, n/10, c, n/100, "decile %d", k)
	}
	// Independence from the layout: the same global sample, asked for by a
	// different (rank, micro) under a different (N, A), is the same window.
	// Step 1, N=2, A=3, B=2 -> G=12; rank 1, micro 2 holds i = 2·2·2+1·2 = 10,11.
	x, _ := a.Batch(1, 2, 1, 2, 2, 3)
	w0, _ := a.Sample(12 + 10)
	w1, _ := a.Sample(12 + 11)
	assert.Equal(t, append(append([]int32{}, w0...), w1...), x.I32())
	// The same samples as single-process step 0 with G = 24 (indices 22, 23).
	x1, _ := a.Batch(0, 0, 0, 1, 24, 1)
	assert.Equal(t, x.I32(), x1.I32()[22*T:24*T])
}

func TestEvalBatch(t *testing.T) {
	const L, T, B = 60, 4, 3
	tokens := stream(L)
	span := L - T - 1 // 55
	for _, order := range []string{Sequential, Random} {
		l, err := NewLoader(tokens, T, order, 9)
		require.NoError(t, err)
		for k := 0; k < 7; k++ {
			x, y := l.EvalBatch(k, 0, 0, 1, B, 1)
			require.Equal(t, []int{B, T}, x.Shape())
			for j := 0; j < B; j++ {
				o := ((k*B + j) * T) % span
				assert.Equal(t, tokens[o:o+T], x.I32()[j*T:(j+1)*T], "order=%s k=%d j=%d", order, k, j)
				assert.Equal(t, tokens[o+1:o+T+1], y.I32()[j*T:(j+1)*T])
			}
		}
	}
}

// TestEvalBatchSplitsLikeBatch: the micro-batches of the ranks of an
// evaluation batch, concatenated micro-batch outer and rank inner, are
// one process's evaluation batch of the same global size.
func TestEvalBatchSplitsLikeBatch(t *testing.T) {
	const T, B = 5, 2
	l, err := NewLoader(stream(211), T, Random, 7)
	require.NoError(t, err)
	for _, N := range []int{1, 2, 4} {
		for _, A := range []int{1, 3} {
			G := B * A * N
			for k := 0; k < 3; k++ {
				xs, ys := concat(l.EvalBatch, k, N, B, A)
				x, y := l.EvalBatch(k, 0, 0, 1, G, 1)
				require.Equal(t, x.I32(), xs, "N=%d A=%d k=%d", N, A, k)
				require.Equal(t, y.I32(), ys, "N=%d A=%d k=%d", N, A, k)
			}
		}
	}
}

func TestBatchIsACopy(t *testing.T) {
	tokens := stream(50)
	l, err := NewLoader(tokens, 4, Sequential, 0)
	require.NoError(t, err)
	x, _ := l.Batch(0, 0, 0, 1, 2, 1)
	x.I32()[0] = -5
	assert.Equal(t, int32(0), tokens[0])
}

func TestBatchPanicsOnBadArguments(t *testing.T) {
	l, err := NewLoader(stream(50), 4, Sequential, 0)
	require.NoError(t, err)
	assert.PanicsWithValue(t, "data: Batch(step=0, micro=0, rank=2, nranks=2, B=1, A=1): need step>=0, B,A,nranks>=1, 0<=micro<A, 0<=rank<nranks",
		func() { l.Batch(0, 0, 2, 2, 1, 1) })
	assert.Panics(t, func() { l.Batch(0, 1, 0, 1, 1, 1) })
	assert.PanicsWithValue(t, "data: EvalBatch(k=-1, micro=0, rank=0, nranks=1, B=1, A=1): need k>=0, B,A,nranks>=1, 0<=micro<A, 0<=rank<nranks",
		func() { l.EvalBatch(-1, 0, 0, 1, 1, 1) })
	assert.Panics(t, func() { l.Sample(-1) })
}

// A loader that keeps some columns returns exactly those positions of the
// windows the whole loader returns, inputs and targets alike.
func TestKeepColumns(t *testing.T) {
	toks := make([]int32, 200)
	for i := range toks {
		toks[i] = int32(i * 7 % 101)
	}
	whole, err := NewLoader(toks, 8, "random", 3)
	if err != nil {
		t.Fatal(err)
	}
	part, err := NewLoader(toks, 8, "random", 3)
	if err != nil {
		t.Fatal(err)
	}
	cols := []int{0, 1, 6, 7}
	if err := part.KeepColumns(cols); err != nil {
		t.Fatal(err)
	}
	wx, wy := whole.Batch(2, 1, 1, 2, 3, 2)
	px, py := part.Batch(2, 1, 1, 2, 3, 2)
	if s := px.Shape(); len(s) != 2 || s[0] != 3 || s[1] != 4 {
		t.Fatalf("shape %v, want [3 4]", s)
	}
	for b := 0; b < 3; b++ {
		for i, c := range cols {
			if px.I32()[b*4+i] != wx.I32()[b*8+c] || py.I32()[b*4+i] != wy.I32()[b*8+c] {
				t.Fatalf("row %d column %d differs from the whole window's position %d", b, i, c)
			}
		}
	}
	if err := part.KeepColumns([]int{8}); err == nil || err.Error() != "data: column 8 is outside a window of block_size 8" {
		t.Fatalf("got %v", err)
	}
}
