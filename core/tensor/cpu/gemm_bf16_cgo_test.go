//go:build cgo && !purego

package cpu

import (
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
	if !bf16Native {
		t.Skip("no AVX512-BF16 kernel on this CPU or build: " + HalfGemmPath())
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
