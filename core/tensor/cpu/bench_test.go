package cpu

import (
	"math"
	"testing"
)

// Benchmarks at the sizes of the target model: GPT-2 shape with n_layer 4,
// n_head 4, n_embd 256, T 256, batch 8 (2048 rows).
const (
	benchB  = 8
	benchT  = 256
	benchC  = 256
	benchNH = 4
	benchN  = benchB * benchT
)

func benchGemm(b *testing.B, gemm func(ta, tb bool, m, n, k int, alpha float32, a []float32, lda int, bb []float32, ldb int, beta float32, c []float32, ldc int)) {
	shapes := []struct {
		name    string
		ta, tb  bool
		m, n, k int
	}{
		{"fwd_qkv_2048x768x256", false, false, benchN, 3 * benchC, benchC},
		{"fwd_fc_2048x1024x256", false, false, benchN, 4 * benchC, benchC},
		{"fwd_proj_2048x256x1024", false, false, benchN, benchC, 4 * benchC},
		{"bwd_dx_2048x256x1024_tB", false, true, benchN, benchC, 4 * benchC},
		{"bwd_dw_256x1024x2048_tA", true, false, benchC, 4 * benchC, benchN},
		{"head_qk_256x256x64_tB", false, true, benchT, benchT, benchC / benchNH},
		// GPT-2 small (768 wide), the same 2048 rows: the weight
		// gradients are the long-k products (k = rows).
		{"s_fwd_fc_2048x3072x768", false, false, benchN, 4 * 768, 768},
		{"s_bwd_dx_2048x768x3072_tB", false, true, benchN, 768, 4 * 768},
		{"s_bwd_dw_768x3072x2048_tA", true, false, 768, 4 * 768, benchN},
		{"s_bwd_dw_768x768x2048_tA", true, false, 768, 768, benchN},
		{"s_bwd_dw_3072x768x2048_tA", true, false, 4 * 768, 768, benchN},
	}
	for _, s := range shapes {
		b.Run(s.name, func(b *testing.B) {
			rng := newRNG(9)
			a := randSlice[float32](rng, s.m*s.k, 1)
			bb := randSlice[float32](rng, s.k*s.n, 1)
			c := make([]float32, s.m*s.n)
			lda, ldb := s.k, s.n
			if s.ta {
				lda = s.m
			}
			if s.tb {
				ldb = s.k
			}
			b.ResetTimer()
			for range b.N {
				gemm(s.ta, s.tb, s.m, s.n, s.k, 1, a, lda, bb, ldb, 0, c, s.n)
			}
			b.ReportMetric(2*float64(s.m*s.n*s.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

func BenchmarkGemm(b *testing.B) {
	b.Run(BLASName(), func(b *testing.B) { benchGemm(b, Gemm[float32]) })
}

func BenchmarkGemmGo(b *testing.B) { benchGemm(b, gemmGo[float32]) }

// BenchmarkGemmRoundBF16 runs the same shapes as bf16 products (float32
// operands rounded while packed, float32 accumulation) on HalfGemmPath's path.
func BenchmarkGemmRoundBF16(b *testing.B) {
	b.Run(HalfGemmPath(), func(b *testing.B) { benchGemm(b, GemmRoundBF16) })
}

func BenchmarkGeluForward(b *testing.B) {
	x := randSlice[float32](newRNG(1), benchN*4*benchC, 3)
	y := make([]float32, len(x))
	b.SetBytes(int64(8 * len(x)))
	for range b.N {
		GeluForward(x, y)
	}
}

func BenchmarkGeluBackward(b *testing.B) {
	x := randSlice[float32](newRNG(1), benchN*4*benchC, 3)
	dy := randSlice[float32](newRNG(2), len(x), 1)
	dx := make([]float32, len(x))
	b.SetBytes(int64(12 * len(x)))
	for range b.N {
		GeluBackward(x, dy, dx)
	}
}

// BenchmarkGeluForwardMathTanh is the straightforward float64 math.Tanh
// loop, single-threaded, for comparison with the fast path.
func BenchmarkGeluForwardMathTanh(b *testing.B) {
	x := randSlice[float32](newRNG(1), benchN*4*benchC, 3)
	y := make([]float32, len(x))
	for range b.N {
		for i, v := range x {
			u := float64(v)
			y[i] = float32(0.5 * u * (1 + math.Tanh(geluK*(u+geluA*u*u*u))))
		}
	}
}

func BenchmarkLayerNormForward(b *testing.B) {
	rng := newRNG(3)
	x := randSlice[float32](rng, benchN*benchC, 2)
	w, bb := randSlice[float32](rng, benchC, 1), randSlice[float32](rng, benchC, 1)
	y, mean, rstd := make([]float32, len(x)), make([]float32, benchN), make([]float32, benchN)
	for range b.N {
		LayerNormForward(x, w, bb, y, mean, rstd, benchN, benchC, 1e-5)
	}
}

func BenchmarkLayerNormBackward(b *testing.B) {
	rng := newRNG(3)
	x := randSlice[float32](rng, benchN*benchC, 2)
	w, bb := randSlice[float32](rng, benchC, 1), randSlice[float32](rng, benchC, 1)
	y, mean, rstd := make([]float32, len(x)), make([]float32, benchN), make([]float32, benchN)
	LayerNormForward(x, w, bb, y, mean, rstd, benchN, benchC, 1e-5)
	dx, dw, db := make([]float32, len(x)), make([]float32, benchC), make([]float32, benchC)
	b.ResetTimer()
	for range b.N {
		LayerNormBackward(y, x, w, mean, rstd, dx, dw, db, benchN, benchC)
	}
}

func benchAttention(b *testing.B, backward bool) {
	rng := newRNG(4)
	qkv := randSlice[float32](rng, benchN*3*benchC, 1)
	out, att := make([]float32, benchN*benchC), make([]float32, benchB*benchNH*benchT*benchT)
	dout := randSlice[float32](rng, len(out), 1)
	dqkv := make([]float32, len(qkv))
	AttentionForward(qkv, out, att, benchB, benchT, benchC, benchNH)
	b.ResetTimer()
	for range b.N {
		if backward {
			AttentionBackward(dout, qkv, att, dqkv, benchB, benchT, benchC, benchNH)
		} else {
			AttentionForward(qkv, out, att, benchB, benchT, benchC, benchNH)
		}
	}
}

// BenchmarkAttention compares the per-head products through Gemm (OpenBLAS
// when linked, held single-threaded while heads run in parallel) and
// through the pure-Go kernel.
func BenchmarkAttention(b *testing.B) {
	for _, impl := range []struct {
		name string
		gemm func(ta, tb bool, m, n, k int, alpha float32, a []float32, lda int, bb []float32, ldb int, beta float32, c []float32, ldc int)
	}{{"gemm_" + BLASName(), gemmBLAS[float32]}, {"gemm_go", gemmGo[float32]}} {
		if impl.name == "gemm_go" && BLASName() == "go" {
			continue // the first entry already measured it
		}
		old := headGemm
		headGemm = impl.gemm
		b.Run(impl.name+"/forward", func(b *testing.B) { benchAttention(b, false) })
		b.Run(impl.name+"/backward", func(b *testing.B) { benchAttention(b, true) })
		headGemm = old
	}
}

func BenchmarkCrossEntropy(b *testing.B) {
	rng := newRNG(5)
	vocab := 256
	logits := randSlice[float32](rng, benchN*vocab, 4)
	targets := make([]int32, benchN)
	for i := range targets {
		targets[i] = int32(rng.IntN(vocab))
	}
	probs, losses := make([]float32, len(logits)), make([]float32, benchN)
	dl, dlogits := make([]float32, benchN), make([]float32, len(logits))
	for i := range dl {
		dl[i] = 1.0 / benchN
	}
	b.Run("forward", func(b *testing.B) {
		for range b.N {
			CrossEntropyForward(logits, targets, benchN, vocab, probs, losses)
		}
	})
	b.Run("backward", func(b *testing.B) {
		for range b.N {
			CrossEntropyBackward(probs, targets, dl, benchN, vocab, dlogits)
		}
	})
}

func BenchmarkAdamW(b *testing.B) {
	const n = 3_300_000 // parameters of the target model
	rng := newRNG(6)
	p, g := randSlice[float32](rng, n, 1), randSlice[float32](rng, n, 1)
	m, v := make([]float32, n), make([]float32, n)
	b.ResetTimer()
	for i := range b.N {
		AdamW(p, g, m, v, 1e-3, 0.9, 0.95, 1e-8, 0.1, i+1)
	}
}

func BenchmarkBiasGrad(b *testing.B) {
	dy := randSlice[float32](newRNG(7), benchN*4*benchC, 1)
	db := make([]float32, 4*benchC)
	for range b.N {
		BiasGrad(dy, db, benchN, 4*benchC)
	}
}

// BenchmarkAttentionStep times one attention layer's forward and backward
// in the two forms side by side: "saved" keeps the [T, T] probabilities
// from the forward for the backward (AttentionForward/Backward, the naive
// form), "lse" keeps only the output and the log-sum-exp and recomputes
// the probabilities in the backward (AttentionPosForward/LSEBackward, the
// form the models use). Their ratio is the time the memory saving costs.
func BenchmarkAttentionStep(b *testing.B) {
	rng := newRNG(4)
	qkv := randSlice[float32](rng, benchN*3*benchC, 1)
	dout := randSlice[float32](rng, benchN*benchC, 1)
	out, dqkv := make([]float32, benchN*benchC), make([]float32, len(qkv))
	b.Run("saved", func(b *testing.B) {
		att := make([]float32, benchB*benchNH*benchT*benchT)
		for range b.N {
			AttentionForward(qkv, out, att, benchB, benchT, benchC, benchNH)
			clear(dqkv)
			AttentionBackward(dout, qkv, att, dqkv, benchB, benchT, benchC, benchNH)
		}
	})
	b.Run("lse", func(b *testing.B) {
		C := benchC
		d := AttnDims{B: benchB, NH: benchNH, HS: C / benchNH, Tq: benchT, Tk: benchT, LdQ: 3 * C, LdK: 3 * C, LdV: 3 * C, LdO: C}
		pos := make([]int, benchT)
		for i := range pos {
			pos[i] = i
		}
		lse, delta := make([]float32, benchB*benchNH*benchT), make([]float32, benchB*benchNH*benchT)
		for range b.N {
			AttentionPosForward(d, qkv, qkv[C:], qkv[2*C:], pos, pos, out, nil, lse)
			clear(dqkv)
			AttentionDelta(d, dout, out, delta)
			AttentionLSEBackward(d, dout, qkv, qkv[C:], qkv[2*C:], delta, lse, pos, pos, dqkv, dqkv[C:], dqkv[2*C:])
		}
	})
}
