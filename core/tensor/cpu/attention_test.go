package cpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// refAttention is causal multi-head attention written as plain loops in
// float64: per head, scores, masked softmax, weighted sum of values.
func refAttention(qkv []float64, B, T, C, NH int) (out, att []float64) {
	hs := C / NH
	out = make([]float64, B*T*C)
	att = make([]float64, B*NH*T*T)
	at := func(b, t, col int) float64 { return qkv[(b*T+t)*3*C+col] }
	for b := 0; b < B; b++ {
		for h := 0; h < NH; h++ {
			for t := 0; t < T; t++ {
				p := att[((b*NH+h)*T+t)*T : ((b*NH+h)*T+t+1)*T]
				mx := math.Inf(-1)
				for s := 0; s <= t; s++ {
					var dot float64
					for i := 0; i < hs; i++ {
						dot += at(b, t, h*hs+i) * at(b, s, C+h*hs+i)
					}
					p[s] = dot / math.Sqrt(float64(hs))
					mx = math.Max(mx, p[s])
				}
				var sum float64
				for s := 0; s <= t; s++ {
					p[s] = math.Exp(p[s] - mx)
					sum += p[s]
				}
				for s := 0; s <= t; s++ {
					p[s] /= sum
					for i := 0; i < hs; i++ {
						out[(b*T+t)*C+h*hs+i] += p[s] * at(b, s, 2*C+h*hs+i)
					}
				}
			}
		}
	}
	return out, att
}

// refAttentionBackward differentiates refAttention by hand, loop by loop.
func refAttentionBackward(dout, qkv, att []float64, B, T, C, NH int) []float64 {
	hs := C / NH
	scale := 1 / math.Sqrt(float64(hs))
	d := make([]float64, B*T*3*C)
	idx := func(b, t, col int) int { return (b*T+t)*3*C + col }
	for b := 0; b < B; b++ {
		for h := 0; h < NH; h++ {
			for t := 0; t < T; t++ {
				p := att[((b*NH+h)*T+t)*T:]
				dp := make([]float64, t+1)
				for s := 0; s <= t; s++ {
					for i := 0; i < hs; i++ {
						g := dout[(b*T+t)*C+h*hs+i]
						dp[s] += g * qkv[idx(b, s, 2*C+h*hs+i)]
						d[idx(b, s, 2*C+h*hs+i)] += p[s] * g
					}
				}
				var dot float64
				for s := 0; s <= t; s++ {
					dot += p[s] * dp[s]
				}
				for s := 0; s <= t; s++ {
					ds := p[s] * (dp[s] - dot) * scale
					for i := 0; i < hs; i++ {
						d[idx(b, t, h*hs+i)] += ds * qkv[idx(b, s, C+h*hs+i)]
						d[idx(b, s, C+h*hs+i)] += ds * qkv[idx(b, t, h*hs+i)]
					}
				}
			}
		}
	}
	return d
}

func testAttentionForward[F Float](t *testing.T) {
	for _, sh := range [][4]int{{1, 1, 4, 1}, {2, 5, 8, 2}, {2, 70, 12, 3}, {1, 130, 16, 4}} {
		B, T, C, NH := sh[0], sh[1], sh[2], sh[3]
		t.Run(fmt.Sprint(sh), func(t *testing.T) {
			rng := newRNG(31)
			qkv := randSlice[F](rng, B*T*3*C, 2)
			out := make([]F, B*T*C)
			att := randSlice[F](rng, B*NH*T*T, 1) // garbage: must be overwritten
			AttentionForward(qkv, out, att, B, T, C, NH)
			wantOut, wantAtt := refAttention(to64(qkv), B, T, C, NH)
			tol := tolFor[F](1e-6, 1e-13)
			requireClose(t, out, wantOut, tol, "out")
			requireClose(t, att, wantAtt, tol, "att")
			for i := 0; i < B*NH*T*T; i++ {
				if i%T > (i/T)%T {
					require.Zero(t, att[i], "att above the diagonal at %d", i)
				}
			}
		})
	}
}

func TestAttentionForward(t *testing.T) {
	t.Run("float32", testAttentionForward[float32])
	t.Run("float64", testAttentionForward[float64])
}

// TestAttentionBackwardFiniteDifferences differentiates L = sum(g * out)
// numerically in float64 on a small problem.
func TestAttentionBackwardFiniteDifferences(t *testing.T) {
	B, T, C, NH := 2, 6, 8, 2
	rng := newRNG(32)
	qkv := randSlice[float64](rng, B*T*3*C, 1.5)
	g := randSlice[float64](rng, B*T*C, 1)
	loss := func() float64 {
		out, att := make([]float64, B*T*C), make([]float64, B*NH*T*T)
		AttentionForward(qkv, out, att, B, T, C, NH)
		var s float64
		for i := range out {
			s += g[i] * out[i]
		}
		return s
	}
	want := randSlice[float64](rng, len(qkv), 1)
	dqkv := append([]float64(nil), want...) // accumulation on top of old values
	for i := range qkv {
		old := qkv[i]
		qkv[i] = old + 1e-6
		lp := loss()
		qkv[i] = old - 1e-6
		lm := loss()
		qkv[i] = old
		want[i] += (lp - lm) / 2e-6
	}
	out, att := make([]float64, B*T*C), make([]float64, B*NH*T*T)
	AttentionForward(qkv, out, att, B, T, C, NH)
	AttentionBackward(g, qkv, att, dqkv, B, T, C, NH)
	requireClose(t, dqkv, want, 1e-8, "dqkv")
}

func testAttentionBackward[F Float](t *testing.T) {
	for _, sh := range [][4]int{{1, 1, 4, 1}, {2, 5, 8, 2}, {2, 70, 12, 3}, {1, 130, 16, 4}} {
		B, T, C, NH := sh[0], sh[1], sh[2], sh[3]
		t.Run(fmt.Sprint(sh), func(t *testing.T) {
			rng := newRNG(33)
			qkv := randSlice[F](rng, B*T*3*C, 2)
			dout := randSlice[F](rng, B*T*C, 1)
			out, att := make([]F, B*T*C), make([]F, B*NH*T*T)
			AttentionForward(qkv, out, att, B, T, C, NH)
			dqkv := make([]F, len(qkv))
			AttentionBackward(dout, qkv, att, dqkv, B, T, C, NH)
			_, att64 := refAttention(to64(qkv), B, T, C, NH)
			want := refAttentionBackward(to64(dout), to64(qkv), att64, B, T, C, NH)
			requireClose(t, dqkv, want, tolFor[F](2e-6, 1e-12), "dqkv")
		})
	}
}

func TestAttentionBackward(t *testing.T) {
	t.Run("float32", testAttentionBackward[float32])
	t.Run("float64", testAttentionBackward[float64])
}

func TestAttentionBackwardDeterministic(t *testing.T) {
	B, T, C, NH := 2, 150, 32, 4
	rng := newRNG(34)
	qkv := randSlice[float32](rng, B*T*3*C, 2)
	dout := randSlice[float32](rng, B*T*C, 1)
	run := func(n int) (out, dqkv []float32) {
		withThreads(n, func() {
			out, att := make([]float32, B*T*C), make([]float32, B*NH*T*T)
			AttentionForward(qkv, out, att, B, T, C, NH)
			dqkv = make([]float32, len(qkv))
			AttentionBackward(dout, qkv, att, dqkv, B, T, C, NH)
		})
		return
	}
	out1, d1 := run(1)
	for _, n := range []int{2, 3} {
		out, d := run(n)
		require.Equal(t, out1, out, "out with %d threads", n)
		require.Equal(t, d1, d, "dqkv with %d threads", n)
	}
}

func TestAttentionBadShape(t *testing.T) {
	require.PanicsWithValue(t, "cpu.AttentionForward: bad shape B=1 T=2 C=6 NH=4; need NH >= 1 dividing C",
		func() { AttentionForward(make([]float32, 36), make([]float32, 12), make([]float32, 16), 1, 2, 6, 4) })
	require.PanicsWithValue(t, "cpu.AttentionForward: out has 11 elements, need 12 for B=1 T=2 C=6 NH=3",
		func() { AttentionForward(make([]float32, 36), make([]float32, 11), make([]float32, 12), 1, 2, 6, 3) })
}
