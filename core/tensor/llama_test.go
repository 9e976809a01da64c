package tensor

import (
	"math"
	"math/rand"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGradRMSNorm(t *testing.T) {
	r := rand.New(rand.NewSource(11))
	x, w := randT(r, 2, 3, 4, 6), randT(r, 1, 6)
	gradCheck(t, "rmsnorm", func() *Tensor { return RMSNorm(x, w, 1e-5) }, x, w)
	// The forward is x / sqrt(mean(x²) + eps) · w, row by row.
	y := RMSNorm(x, w, 1e-5)
	for row := 0; row < 12; row++ {
		var ss float64
		for c := 0; c < 6; c++ {
			ss += x.f64[row*6+c] * x.f64[row*6+c]
		}
		for c := 0; c < 6; c++ {
			require.InDelta(t, x.f64[row*6+c]/math.Sqrt(ss/6+1e-5)*w.f64[c], y.f64[row*6+c], 1e-14)
		}
	}
}

func TestGradSiluMul(t *testing.T) {
	r := rand.New(rand.NewSource(12))
	x := randT(r, 2, 2, 3, 10)
	gradCheck(t, "silu_mul", func() *Tensor { return SiluMul(x) }, x)
	y := SiluMul(x)
	for row := 0; row < 6; row++ {
		for i := 0; i < 5; i++ {
			g, u := x.f64[row*10+i], x.f64[row*10+5+i]
			require.InDelta(t, g/(1+math.Exp(-g))*u, y.f64[row*5+i], 1e-14)
		}
	}
}

func TestGradLinearT(t *testing.T) {
	r := rand.New(rand.NewSource(13))
	x, a, b, c := randT(r, 1, 2, 3, 5), randT(r, 0.5, 4, 5), randT(r, 0.5, 2, 5), randT(r, 0.5, 3, 5)
	gradCheck(t, "linear_t", func() *Tensor { return LinearT(x, a, b, c) }, x, a, b, c)
	gradCheck(t, "linear_t one", func() *Tensor { return LinearT(x, b) }, x, b)
	// Side by side, the products x·wᵀ.
	want := Concat(MatMulT(x, a), MatMulT(x, b), MatMulT(x, c))
	require.Equal(t, want.f64, LinearT(x, a, b, c).f64)
}

// zigzag are the positions a rank of a zigzag split holds: chunks 1 and 6
// of a 16-token sequence cut into 8 chunks of 2.
var zigzag = []int{2, 3, 12, 13}

func TestGradRoPE(t *testing.T) {
	r := rand.New(rand.NewSource(14))
	const H, K, hs = 4, 2, 6
	x := randT(r, 1, 2, 4, (H+2*K)*hs)
	gradCheck(t, "rope", func() *Tensor { return RoPE(x, H, K, nil, 10000) }, x)
	gradCheck(t, "rope zigzag", func() *Tensor { return RoPE(x, H, K, zigzag, 500) }, x)
}

// RoPE in Hugging Face's rotate_half convention: a row at position p is
// x·cos + rotate_half(x)·sin with the angle p·θ^(-2(d mod hs/2)/hs), and
// the value columns pass unchanged. Rows given their positions turn as the
// same rows do inside the whole sequence.
func TestRoPEConvention(t *testing.T) {
	r := rand.New(rand.NewSource(15))
	const H, K, hs, T, theta = 2, 1, 8, 16, 10000.0
	W := (H + 2*K) * hs
	whole := randT(r, 1, 1, T, W)
	got := RoPE(whole, H, K, nil, theta)
	for p := 0; p < T; p++ {
		for head := 0; head < H+2*K; head++ {
			for d := 0; d < hs; d++ {
				x := whole.f64[p*W+head*hs:]
				want := x[d]
				if head < H+K {
					i := d % (hs / 2)
					ang := float64(p) / math.Pow(theta, float64(2*i)/hs)
					var rot float64 // rotate_half: [-x2, x1]
					if d < hs/2 {
						rot = -x[d+hs/2]
					} else {
						rot = x[d-hs/2]
					}
					want = x[d]*math.Cos(ang) + rot*math.Sin(ang)
				}
				require.InDelta(t, want, got.f64[p*W+head*hs+d], 1e-12, "position %d head %d dim %d", p, head, d)
			}
		}
	}
	part := Default.New(Params, Float64, 1, len(zigzag), W)
	for i, p := range zigzag {
		copy(part.f64[i*W:(i+1)*W], whole.f64[p*W:(p+1)*W])
	}
	rp := RoPE(part, H, K, zigzag, theta)
	for i, p := range zigzag {
		require.InDeltaSlice(t, got.f64[p*W:(p+1)*W], rp.f64[i*W:(i+1)*W], 1e-15, "zigzag row at position %d", p)
	}
}

func TestGradGroupedAttention(t *testing.T) {
	r := rand.New(rand.NewSource(16))
	const H, K, hs = 4, 2, 3
	x := randT(r, 1, 2, 5, (H+2*K)*hs)
	gradCheck(t, "grouped attention", func() *Tensor { return GroupedAttention(x, H, K, nil) }, x)
	gradCheck(t, "grouped attention zigzag", func() *Tensor { return GroupedAttention(x, H, K, []int{1, 2, 7, 8, 20}) }, x)
	y := randT(r, 1, 2, 5, (H+2)*hs)
	gradCheck(t, "multi-query attention", func() *Tensor { return GroupedAttention(y, H, 1, nil) }, y)
}

// Grouped-query attention is multi-head attention with each key/value
// head repeated for the query heads of its group; the gradient of a shared
// head is the sum of its copies'.
func TestGroupedAttentionIsRepeatedKV(t *testing.T) {
	r := rand.New(rand.NewSource(17))
	const B, T, H, K, hs = 2, 7, 6, 2, 4
	C, G := H*hs, H/K
	x := randT(r, 1, B, T, (H+2*K)*hs)
	rep := Default.New(Params, Float64, B, T, 3*C).RequiresGrad()
	for row := 0; row < B*T; row++ {
		src, dst := x.f64[row*(H+2*K)*hs:], rep.f64[row*3*C:]
		copy(dst[:C], src[:C])
		for h := 0; h < H; h++ {
			copy(dst[C+h*hs:C+(h+1)*hs], src[C+(h/G)*hs:C+(h/G+1)*hs])
			copy(dst[2*C+h*hs:2*C+(h+1)*hs], src[C+K*hs+(h/G)*hs:C+K*hs+(h/G+1)*hs])
		}
	}
	got, want := GroupedAttention(x, H, K, nil), CausalSelfAttention(rep, H)
	require.InDeltaSlice(t, want.f64, got.f64, 1e-13)
	_, err := Backward(project(got, 3), nil, BackwardOptions{})
	require.NoError(t, err)
	_, err = Backward(project(want, 3), nil, BackwardOptions{})
	require.NoError(t, err)
	for row := 0; row < B*T; row++ {
		g, gr := x.Grad.f64[row*(H+2*K)*hs:], rep.Grad.f64[row*3*C:]
		require.InDeltaSlice(t, gr[:C], g[:C], 1e-13)
		for kv := 0; kv < 2*K; kv++ { // k heads, then v heads
			sum := make([]float64, hs)
			for j := 0; j < G; j++ {
				h := (kv%K)*G + j
				off := C + (kv/K)*C + h*hs
				for i := range sum {
					sum[i] += gr[off+i]
				}
			}
			require.InDeltaSlice(t, sum, g[C+kv*hs:C+(kv+1)*hs], 1e-13)
		}
	}
}
