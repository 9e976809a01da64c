package cpu

import (
	"fmt"
	"math"
)

// attnBlock is the row-block size used to skip the masked half of the
// causal products: rows [i0, i0+attnBlock) only need keys [0, i0+attnBlock),
// so with T = 256 the products do 5/8 of the full T x T work.
const attnBlock = 64

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

// head locates one (batch, head) pair inside the fused layouts.
type head[T Float] struct {
	q, k, v []T // starts of this head's columns in qkv (row stride 3C)
	att     []T // this head's T x T probabilities (row stride T)
	o       []T // start of this head's columns in out / dout (row stride C)
}

func headAt[F Float](bh int, qkv, att, o []F, T, C, NH int) head[F] {
	b, h := bh/NH, bh%NH
	hs := C / NH
	base := b*T*3*C + h*hs
	return head[F]{
		q:   qkv[base:],
		k:   qkv[base+C:],
		v:   qkv[base+2*C:],
		att: att[bh*T*T : (bh+1)*T*T],
		o:   o[b*T*C+h*hs:],
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
// AttentionBackward. Heads run in parallel; each head's products read q, k
// and v in place through the row stride, so nothing is copied.
func AttentionForward[F Float](qkv, out, att []F, B, T, C, NH int) {
	checkAttention("AttentionForward", B, T, C, NH,
		size{"qkv", len(qkv), B * T * 3 * C}, size{"out", len(out), B * T * C}, size{"att", len(att), B * NH * T * T})
	if B == 0 || T == 0 || C == 0 {
		return
	}
	hs := C / NH
	scale := F(1 / math.Sqrt(float64(hs)))
	gemm := gemmFor[F]()
	if B*NH > 1 {
		defer serialBLAS()()
	}
	ParallelFor(B*NH, 1, func(lo, hi int) {
		for bh := lo; bh < hi; bh++ {
			hd := headAt(bh, qkv, att, out, T, C, NH)
			for i0 := 0; i0 < T; i0 += attnBlock {
				i1 := min(T, i0+attnBlock)
				// Scores for rows [i0,i1) against keys [0,i1).
				gemm(false, true, i1-i0, i1, hs, scale, hd.q[i0*3*C:], 3*C, hd.k, 3*C, 0, hd.att[i0*T:], T)
				if isF32[F]() {
					softmaxCausal32(as32(hd.att), T, i0, i1)
				} else {
					for t := i0; t < i1; t++ {
						row := hd.att[t*T : (t+1)*T]
						softmaxCausal(row[:t+1])
						clear(row[t+1:])
					}
				}
				gemm(false, false, i1-i0, hs, i1, 1, hd.att[i0*T:], T, hd.v, 3*C, 0, hd.o[i0*C:], C)
			}
		}
	})
}

// softmaxCausal replaces row with its softmax (the float64 path).
func softmaxCausal[T Float](row []T) {
	mx := row[0]
	for _, v := range row {
		mx = max(mx, v)
	}
	inv := 1 / expShift(row, row, mx)
	for i := range row {
		row[i] *= inv
	}
}

// AttentionBackward accumulates into dqkv ([B, T, 3C], same layout as qkv)
// the gradient of AttentionForward's output given dout ([B, T, C]) and the
// saved qkv and att. Per head, with P = att and s = 1/sqrt(hs):
//
//	dP = dout v^T;  dv += P^T dout
//	dS = P * (dP - rowsum(P * dP))   (softmax backward, causal entries only)
//	dq += s dS k;   dk += s dS^T q
//
// Heads run in parallel and write disjoint columns of dqkv, so the result
// does not depend on the thread count.
func AttentionBackward[F Float](dout, qkv, att, dqkv []F, B, T, C, NH int) {
	checkAttention("AttentionBackward", B, T, C, NH,
		size{"dout", len(dout), B * T * C}, size{"qkv", len(qkv), B * T * 3 * C},
		size{"att", len(att), B * NH * T * T}, size{"dqkv", len(dqkv), B * T * 3 * C})
	if B == 0 || T == 0 || C == 0 {
		return
	}
	hs := C / NH
	scale := F(1 / math.Sqrt(float64(hs)))
	gemm := gemmFor[F]()
	if B*NH > 1 {
		defer serialBLAS()()
	}
	ParallelFor(B*NH, 1, func(lo, hi int) {
		buf := getBuf[F](T * T)
		defer putBuf(buf)
		ds := *buf
		for bh := lo; bh < hi; bh++ {
			hd := headAt(bh, qkv, att, dout, T, C, NH)
			g := headAt(bh, dqkv, att, dout, T, C, NH)
			// Row blocks of dP and dS: rows [i0,i1) have keys [0,i1).
			for i0 := 0; i0 < T; i0 += attnBlock {
				i1 := min(T, i0+attnBlock)
				gemm(false, true, i1-i0, i1, hs, 1, hd.o[i0*C:], C, hd.v, 3*C, 0, ds[i0*T:], T)
				for t := i0; t < i1; t++ {
					softmaxBackward(hd.att[t*T:t*T+t+1], ds[t*T:t*T+t+1])
					clear(ds[t*T+t+1 : t*T+i1]) // masked scores get no gradient
				}
				// dq rows [i0,i1) need dS columns [0,i1).
				gemm(false, false, i1-i0, hs, i1, scale, ds[i0*T:], T, hd.k, 3*C, 1, g.q[i0*3*C:], 3*C)
			}
			// Column blocks for dk and dv: key rows [j0,j1) get contributions
			// from query rows [j0,T) only.
			for j0 := 0; j0 < T; j0 += attnBlock {
				j1 := min(T, j0+attnBlock)
				gemm(true, false, j1-j0, hs, T-j0, scale, ds[j0*T+j0:], T, hd.q[j0*3*C:], 3*C, 1, g.k[j0*3*C:], 3*C)
				gemm(true, false, j1-j0, hs, T-j0, 1, hd.att[j0*T+j0:], T, hd.o[j0*C:], C, 1, g.v[j0*3*C:], 3*C)
			}
		}
	})
}

// softmaxBackward turns dp (the gradient w.r.t. the probabilities p of one
// row) into the gradient w.r.t. the scores: p * (dp - sum(p*dp)).
func softmaxBackward[T Float](p, dp []T) {
	dp = dp[:len(p)]
	var dot T
	for i, v := range p {
		dot += v * dp[i]
	}
	for i, v := range p {
		dp[i] = v * (dp[i] - dot)
	}
}
