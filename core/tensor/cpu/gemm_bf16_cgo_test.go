//go:build cgo && !purego

package cpu

import (
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// withPackLimit runs f with packLimit set to limit and empty pools, so the
// first product allocates its packed buffer anew.
func withPackLimit(limit int, f func()) {
	old := packLimit
	packLimit = limit
	packedPool, scratchPool = sync.Pool{}, sync.Pool{}
	defer func() { packLimit = old }()
	f()
}

// TestGemmBF16BlockedBitwise: a product run in blocks of op(B) (the
// smallest packLimit allows: one panel of one k block) gives C bitwise
// equal to the same product packed whole, in every layout, with and
// without beta, from bf16 and from float32 operands.
func TestGemmBF16BlockedBitwise(t *testing.T) {
	if !bf16Native {
		t.Skip("no AVX512-BF16 kernel on this CPU or build: " + HalfGemmPath())
	}
	blocked := 0
	for _, h := range halfCases() {
		if nb, kb := packBlock(h.n, h.k, 1); nb < h.n || kb < h.k {
			blocked++
		}
		ab, bb := convert(h.a, BF16FromF32), convert(h.b, BF16FromF32)
		run := func(limit int) (c16, c32 []float32) {
			c16, c32 = append([]float32(nil), h.c...), append([]float32(nil), h.c...)
			withPackLimit(limit, func() {
				GemmBF16(h.ta, h.tb, h.m, h.n, h.k, h.alpha, ab, h.lda, bb, h.ldb, h.beta, c16, h.ldc)
				GemmRoundBF16(h.ta, h.tb, h.m, h.n, h.k, h.alpha, h.a, h.lda, h.b, h.ldb, h.beta, c32, h.ldc)
			})
			return c16, c32
		}
		w16, w32 := run(1 << 40)
		g16, g32 := run(1)
		require.Equal(t, w16, g16, h.name)
		require.Equal(t, w32, g32, h.name)
	}
	require.Positive(t, blocked, "some cases run in several blocks")
}

// TestGemmBF16PackedBufferBounded: the bytes a product allocates (its
// packed op(B) and the rows of A each thread packs) stay within packLimit
// and the scratch however wide or deep op(B) is, where packing it whole
// would allocate all of it: 8 MiB for n = 8192 columns of k = 512, 2.5
// MiB for k = 20000.
func TestGemmBF16PackedBufferBounded(t *testing.T) {
	if !bf16Kernel.Load() {
		t.Skip("bf16 products take the portable path here: " + HalfGemmPath())
	}
	const limit = 1 << 20
	scratch := uint64(Threads()+1) * bf16MC * bf16KC * 4
	rng := newRNG(13)
	for _, sz := range [][3]int{{8, 8192, 512}, {8, 64, 20000}, {8, 300, 700}} {
		m, n, k := sz[0], sz[1], sz[2]
		a := convert(randSlice[float32](rng, m*k, 1), BF16FromF32)
		b := convert(randSlice[float32](rng, n*k, 1), BF16FromF32)
		c := make([]float32, m*n)
		var before, after runtime.MemStats
		withPackLimit(limit, func() {
			runtime.ReadMemStats(&before)
			GemmBF16(false, true, m, n, k, 1, a, k, b, k, 0, c, n)
			runtime.ReadMemStats(&after)
		})
		got := after.TotalAlloc - before.TotalAlloc
		require.LessOrEqual(t, got, uint64(limit)+scratch+64<<10, "m %d n %d k %d: whole op(B) packs into %d bytes", m, n, k, 2*packedLen(n, k))
	}
}

// TestPackBlock: blocks within the limit, starting at panel and k-block
// boundaries, whole where op(B) fits, and never smaller than one panel of
// one k block.
func TestPackBlock(t *testing.T) {
	for _, n := range []int{1, 31, 32, 33, 4096, 50257, 200000} {
		for _, k := range []int{1, 2, 255, 256, 257, 512, 3072, 50257} {
			nb, kb := packBlock(n, k, packLimit)
			require.LessOrEqual(t, 2*packedLen(nb, kb), packLimit, "n %d k %d", n, k)
			require.True(t, nb == n || nb%bf16NR == 0, "n %d k %d: nb %d", n, k, nb)
			require.True(t, kb == k || kb%(2*bf16KC) == 0, "n %d k %d: kb %d", n, k, kb)
			if 2*packedLen(n, k) <= packLimit {
				require.Equal(t, [2]int{n, k}, [2]int{nb, kb})
			}
		}
	}
	nb, kb := packBlock(50257, 3072, 1)
	require.Equal(t, [2]int{bf16NR, 2 * bf16KC}, [2]int{nb, kb})
}

// TestGemmBF16TileHeightBitwise: a tile's last rows run on the kernel's
// instances of 8 and 4 rows (kernel_body's h); each row of C is the same
// whatever the height of the tile it falls in, so every row of a product
// of m rows equals, bitwise, the same row of a product of 3*bf16MR rows
// whose tiles are all full, for every m up to a tile and a half, both
// layouts of A, from float32 and from bf16 operands.
func TestGemmBF16TileHeightBitwise(t *testing.T) {
	if !bf16Native {
		t.Skip("no AVX512-BF16 kernel on this CPU or build: " + HalfGemmPath())
	}
	rng := newRNG(17)
	const full, n, k = 3 * bf16MR, 45, 300
	for _, ta := range []bool{false, true} {
		ar, ac := full, k
		if ta {
			ar, ac = k, full
		}
		a, b := randSlice[float32](rng, ar*ac, 1), randSlice[float32](rng, k*n, 1)
		ab, bb := convert(a, BF16FromF32), convert(b, BF16FromF32)
		want32, want16 := make([]float32, full*n), make([]float32, full*n)
		GemmRoundBF16(ta, false, full, n, k, 1, a, ac, b, n, 0, want32, n)
		GemmBF16(ta, false, full, n, k, 1, ab, ac, bb, n, 0, want16, n)
		for m := 1; m <= bf16MR+bf16MR/2; m++ {
			// op(A)'s first m rows: a prefix of the rows, or of each
			// stored row when transposed (stride full)
			got32, got16 := make([]float32, m*n), make([]float32, m*n)
			GemmRoundBF16(ta, false, m, n, k, 1, a, ac, b, n, 0, got32, n)
			GemmBF16(ta, false, m, n, k, 1, ab, ac, bb, n, 0, got16, n)
			require.Equal(t, want32[:m*n], got32, "ta %v m %d from float32", ta, m)
			require.Equal(t, want16[:m*n], got16, "ta %v m %d from bf16", ta, m)
		}
	}
}

// TestGemmBF16BiasBlocked: the bias is added once, after the last k block,
// also when op(B) is packed in blocks of one panel and one k block: the
// product with its bias equals, bitwise, the one packed whole.
func TestGemmBF16BiasBlocked(t *testing.T) {
	if !bf16Native {
		t.Skip("no AVX512-BF16 kernel on this CPU or build: " + HalfGemmPath())
	}
	rng := newRNG(22)
	for _, h := range halfCases() {
		bb := convert(h.b, BF16FromF32)
		bias := randSlice[float32](rng, h.n, 1)
		run := func(limit int) []float32 {
			c := append([]float32(nil), h.c...)
			withPackLimit(limit, func() {
				GemmRoundAHalfBBias(false, h.ta, h.tb, h.m, h.n, h.k, h.alpha, h.a, h.lda, bb, h.ldb, bias, c, h.ldc)
			})
			return c
		}
		require.Equal(t, run(1<<40), run(1), h.name)
	}
}

// TestGemmBF16InPlaceA: a bf16 A not transposed, with k and lda even and
// 4-byte aligned, is read where it is stored for its full tiles and packed
// for a last tile of fewer rows; the product equals, bitwise, the one
// from the float32 A it was rounded from, which is packed, for row counts
// with and without a last partial tile, past one block of rows (MC) and
// of k (KC), dense and padded rows, B in both layouts, and from an odd
// element (2-byte aligned: packed, as before).
func TestGemmBF16InPlaceA(t *testing.T) {
	if !bf16Kernel.Load() {
		t.Skip("bf16 products take the portable path here: " + HalfGemmPath())
	}
	rng := newRNG(29)
	for _, sz := range [][3]int{{12, 33, 64}, {24, 40, 2}, {29, 70, 300}, {2*bf16MC + 5, 45, 130}, {37, 33, 2*bf16KC + 300}} {
		m, n, k := sz[0], sz[1], sz[2]
		for _, pad := range []int{0, 2} {
			for _, off := range []int{0, 1} {
				for _, tb := range []bool{false, true} {
					lda, ldb := k+pad, n
					br, bc := k, n
					if tb {
						br, bc, ldb = n, k, k
					}
					af := randSlice[float32](rng, off+m*lda, 1)
					ah := convert(af, BF16FromF32)
					b := convert(randSlice[float32](rng, br*bc, 1), BF16FromF32)
					for _, beta := range []float32{0, 0.5} {
						c0 := randSlice[float32](rng, m*n, 1)
						want, got := append([]float32(nil), c0...), append([]float32(nil), c0...)
						GemmRoundAHalfB(false, false, tb, m, n, k, 1.5, af[off:], lda, b, ldb, beta, want, n)
						GemmBF16(false, tb, m, n, k, 1.5, ah[off:], lda, b, ldb, beta, got, n)
						requireSameBits(t, got, want, fmt.Sprintf("m %d n %d k %d lda %d from element %d tb %v beta %v", m, n, k, lda, off, tb, beta))
					}
				}
			}
		}
	}
}
