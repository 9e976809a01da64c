package cpu

import (
	"fmt"
)

// attnBlock is the row-block size used to skip the masked half of the
// causal products: rows [i0, i0+attnBlock) only need keys [0, i0+attnBlock),
// so with T = 256 the products do 5/8 of the full T x T work.
const attnBlock = 64

// kernelRowBlock is the row-block size of the attention's products where
// they run on the bf16 kernel: half of attnBlock, so with T = 256 they do
// 9/16 of the full T x T work rather than 5/8. On the kernel every element
// of a product is its own chain of sums, whatever rows and keys share its
// call, so the narrower blocks change no bit; BLAS picks its kernels by a
// product's shape, so the other paths keep attnBlock. The key blocks of
// dk and dv keep attnBlock everywhere: their products' sums run over the
// query rows, and on the kernel a sum of more than 256 terms is split at
// points counted from its first row, which the narrower blocks would move.
// A variable so a test can compare both.
var kernelRowBlock = attnBlock / 2

// attnRows is the row-block size of attention d's products over the rows
// of a head: kernelRowBlock on the bf16 kernel, attnBlock elsewhere.
func attnRows[F Float](d AttnDims) int {
	if isF32[F]() && d.HalfProducts == BF16 && bf16Kernel.Load() {
		return kernelRowBlock
	}
	return attnBlock
}

// headGemm is the float32 matrix product used for the per-head products of
// attention. It is gemmBLAS, called from the head-parallel loop with the BLAS
// library held single-threaded (serialBLAS); BenchmarkAttention swaps in the
// pure-Go kernel to compare.
var headGemm = gemmBLAS[float32]

// size pairs an argument's name and length with the length it needs.
type size struct {
	name       string
	have, need int
}

func checkAttention(op string, B, T, C, NH int, sizes ...size) {
	if B < 0 || T < 0 || C < 0 || NH < 1 || C%NH != 0 {
		panic(fmt.Sprintf("cpu.%s: bad shape B=%d T=%d C=%d NH=%d; need NH >= 1 dividing C", op, B, T, C, NH))
	}
	for _, s := range sizes {
		if s.have < s.need {
			panic(fmt.Sprintf("cpu.%s: %s has %d elements, need %d for B=%d T=%d C=%d NH=%d", op, s.name, s.have, s.need, B, T, C, NH))
		}
	}
}

// gemmFor returns the per-head product for element type T: headGemm for
// float32 (so benchmarks can swap it), gemmBLAS otherwise.
func gemmFor[T Float]() func(ta, tb bool, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int) {
	if isF32[T]() {
		if f, ok := any(headGemm).(func(ta, tb bool, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int)); ok {
			return f
		}
	}
	return gemmBLAS[T]
}

// identity returns the positions 0..n-1.
func identity(n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	return p
}

// fusedDims describes the fused qkv layout of GPT-2's c_attn output to the
// kernels over positions: q, k and v are column ranges of one [B, T, 3C]
// buffer (row stride 3C), out is [B, T, C].
func fusedDims(B, T, C, NH int) AttnDims {
	return AttnDims{B: B, NH: NH, HS: C / NH, Tq: T, Tk: T, LdQ: 3 * C, LdK: 3 * C, LdV: 3 * C, LdO: C}
}

// AttentionForward computes causal multi-head self-attention on a fused
// qkv input in the Hugging Face GPT-2 layout: qkv is [B, T, 3C] with q, k
// and v in column ranges [0,C), [C,2C) and [2C,3C), and head h using
// columns h*hs..(h+1)*hs of each (hs = C/NH). For every head,
//
//	att = softmax(q k^T / sqrt(hs)) with position t attending to 0..t,
//	out = att v,
//
// out is [B, T, C] with the heads' columns in the same order, and att is
// [B, NH, T, T], keeping the probabilities (zero above the diagonal) for
// AttentionBackward. It is AttentionPosForward with positions 0..T-1 for
// queries and keys; the products read q, k and v in place through the row
// stride, so nothing is copied.
func AttentionForward[F Float](qkv, out, att []F, B, T, C, NH int) {
	checkAttention("AttentionForward", B, T, C, NH,
		size{"qkv", len(qkv), B * T * 3 * C}, size{"out", len(out), B * T * C}, size{"att", len(att), B * NH * T * T})
	if B == 0 || T == 0 || C == 0 {
		return
	}
	pos := identity(T)
	AttentionPosForward(fusedDims(B, T, C, NH), qkv, qkv[C:], qkv[2*C:], pos, pos, out, att, nil)
}

// AttentionBackward accumulates into dqkv ([B, T, 3C], same layout as qkv)
// the gradient of AttentionForward's output given dout ([B, T, C]) and the
// saved qkv and att: AttentionPosBackward with positions 0..T-1.
func AttentionBackward[F Float](dout, qkv, att, dqkv []F, B, T, C, NH int) {
	checkAttention("AttentionBackward", B, T, C, NH,
		size{"dout", len(dout), B * T * C}, size{"qkv", len(qkv), B * T * 3 * C},
		size{"att", len(att), B * NH * T * T}, size{"dqkv", len(dqkv), B * T * 3 * C})
	if B == 0 || T == 0 || C == 0 {
		return
	}
	pos := identity(T)
	AttentionPosBackward(fusedDims(B, T, C, NH), dout, qkv, qkv[C:], qkv[2*C:], att, pos, pos, dqkv, dqkv[C:], dqkv[2*C:])
}

// softmaxBackward turns dp (the gradient w.r.t. the probabilities p of one
// row) into the gradient w.r.t. the scores: p * (dp - sum(p*dp)). float64
// sums in one chain; float32 (softmaxBackward32Go) in sumLanes partial
// sums combined in a fixed order.
func softmaxBackward[T Float](p, dp []T) {
	if isF32[T]() {
		softmaxBackward32Go(as32(p), as32(dp))
		return
	}
	dp = dp[:len(p)]
	var dot T
	for i, v := range p {
		dot += v * dp[i]
	}
	for i, v := range p {
		dp[i] = v * (dp[i] - dot)
	}
}

// softmaxBackward32Go is softmaxBackward in float32.
func softmaxBackward32Go(p, dp []float32) {
	dp = dp[:len(p)]
	var acc [sumLanes]float32
	full := len(p) - len(p)%sumLanes
	for i := 0; i < full; i += sumLanes {
		for j := range acc {
			acc[j] += p[i+j] * dp[i+j]
		}
	}
	for i := full; i < len(p); i++ {
		acc[i-full] += p[i] * dp[i]
	}
	dot := reduceLanes(&acc)
	for i, v := range p {
		dp[i] = v * (dp[i] - dot)
	}
}

// softmaxBackwardRows applies softmaxBackward to the first lens[r] entries
// of each row r of p and dp (stride ld) and zeroes dp's entries from there
// up to ends[r]. Only the backward from stored probabilities
// (AttentionPosBackward) takes it: the model's attentions form their
// probabilities again from the log-sum-exp.
func softmaxBackwardRows[F Float](p, dp []F, ld int, lens, ends []int64) {
	for r, n := range lens {
		softmaxBackward(p[r*ld:r*ld+int(n)], dp[r*ld:r*ld+int(n)])
		clear(dp[r*ld+int(n) : r*ld+int(ends[r])])
	}
}
