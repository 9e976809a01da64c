package tensor

import (
	"math"
	"math/rand"
	"testing"

	"github.com/stretchr/testify/require"
)

// randT returns a float64 leaf with normal(0, std) entries.
func randT(r *rand.Rand, std float64, shape ...int) *Tensor {
	t := Default.New(Params, Float64, shape...)
	for i := range t.f64 {
		t.f64[i] = std * r.NormFloat64()
	}
	return t.RequiresGrad()
}

// project reduces y to a scalar with fixed random weights, so every output
// element's gradient path is exercised.
func project(y *Tensor, seed int64) *Tensor {
	r := rand.New(rand.NewSource(seed))
	w := Default.New(Activations, Float64, y.shape...)
	for i := range w.f64 {
		w.f64[i] = r.NormFloat64()
	}
	return Sum(Mul(y, w))
}

// gradCheck compares the autograd gradient of f with respect to each input
// against central finite differences, norm-wise.
func gradCheck(t *testing.T, name string, f func() *Tensor, inputs ...*Tensor) {
	t.Helper()
	for _, in := range inputs {
		in.Grad = nil
	}
	out := project(f(), 7)
	_, err := Backward(out, nil, BackwardOptions{})
	require.NoError(t, err)
	const h = 1e-6
	for k, in := range inputs {
		require.NotNil(t, in.Grad, "%s: input %d got no gradient", name, k)
		num := make([]float64, in.Numel())
		for i := range in.f64 {
			orig := in.f64[i]
			in.f64[i] = orig + h
			fp := project(f(), 7).Scalar()
			in.f64[i] = orig - h
			fm := project(f(), 7).Scalar()
			in.f64[i] = orig
			num[i] = (fp - fm) / (2 * h)
		}
		var diff, ref float64
		for i := range num {
			d := in.Grad.f64[i] - num[i]
			diff += d * d
			ref += num[i] * num[i]
		}
		rel := math.Sqrt(diff) / math.Max(math.Sqrt(ref), 1e-12)
		require.Less(t, rel, 1e-6, "%s: input %d (%v) relative gradient error", name, k, in.shape)
	}
}

func TestGradLinear(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	x, w, b := randT(r, 1, 2, 3, 5), randT(r, 0.5, 5, 4), randT(r, 0.5, 4)
	gradCheck(t, "linear", func() *Tensor { return Linear(x, w, b) }, x, w, b)
	gradCheck(t, "linear no bias", func() *Tensor { return Linear(x, w, nil) }, x, w)
}

func TestGradMatMulT(t *testing.T) {
	r := rand.New(rand.NewSource(2))
	x, w := randT(r, 1, 3, 5), randT(r, 0.5, 7, 5)
	gradCheck(t, "matmul_t", func() *Tensor { return MatMulT(x, w) }, x, w)
}

func TestGradLayerNorm(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	x, w, b := randT(r, 2, 4, 6), randT(r, 1, 6), randT(r, 1, 6)
	gradCheck(t, "layernorm", func() *Tensor { return LayerNorm(x, w, b, 1e-5) }, x, w, b)
}

func TestGradGelu(t *testing.T) {
	r := rand.New(rand.NewSource(4))
	x := randT(r, 2, 3, 7)
	gradCheck(t, "gelu", func() *Tensor { return Gelu(x) }, x)
}

func TestGradAttention(t *testing.T) {
	r := rand.New(rand.NewSource(5))
	qkv := randT(r, 1, 2, 5, 3*6) // B=2, T=5, C=6, 2 heads of 3
	gradCheck(t, "attention", func() *Tensor { return CausalSelfAttention(qkv, 2) }, qkv)
}

func TestGradEmbeddingAndPositions(t *testing.T) {
	r := rand.New(rand.NewSource(6))
	wte, wpe := randT(r, 1, 5, 4), randT(r, 1, 6, 4)
	idx := FromI32([]int32{1, 3, 1, 0, 4, 1}, 2, 3) // repeated ids accumulate
	gradCheck(t, "embedding+positions", func() *Tensor { return AddPositions(Embedding(wte, idx), wpe, nil) }, wte, wpe)
	// A rank's rows at scattered global positions (a zigzag split).
	gradCheck(t, "embedding+position ids", func() *Tensor { return AddPositions(Embedding(wte, idx), wpe, []int{0, 4, 5}) }, wte, wpe)
}

func TestPositionIDs(t *testing.T) {
	x := FromF64([]float64{1, 2, 3, 4}, 1, 2, 2)
	wpe := FromF64([]float64{10, 20, 30, 40, 50, 60}, 3, 2)
	require.Equal(t, []float64{51, 62, 13, 24}, AddPositions(x, wpe, []int{2, 0}).F64())
	require.Equal(t, []float64{11, 22, 33, 44}, AddPositions(x, wpe, nil).F64())
}

func TestGradColumnsConcat(t *testing.T) {
	r := rand.New(rand.NewSource(9))
	x, y := randT(r, 1, 2, 3, 5), randT(r, 1, 2, 3, 2)
	gradCheck(t, "columns+concat", func() *Tensor {
		return Concat(Columns(x, 3, 5), y, Columns(x, 0, 2))
	}, x, y)
	got := Concat(Columns(FromF64([]float64{1, 2, 3, 4, 5, 6}, 2, 3), 1, 3), FromF64([]float64{7, 8}, 2, 1))
	require.Equal(t, []float64{2, 3, 7, 5, 6, 8}, got.F64())
	require.Equal(t, []int{2, 3}, got.Shape())
}

func TestGradCrossEntropy(t *testing.T) {
	r := rand.New(rand.NewSource(7))
	logits := randT(r, 2, 2, 3, 5)
	targets := FromI32([]int32{0, 4, 2, -1, 3, 3}, 2, 3) // one ignored position
	gradCheck(t, "cross_entropy", func() *Tensor { return CrossEntropy(logits, targets) }, logits)
}

func TestGradAddScaleView(t *testing.T) {
	r := rand.New(rand.NewSource(8))
	a, b := randT(r, 1, 2, 3), randT(r, 1, 2, 3)
	gradCheck(t, "add/scale/view", func() *Tensor {
		return View(Scale(Add(a, Add(a, b)), 0.5), 3, 2)
	}, a, b)
}

func TestCrossEntropyValue(t *testing.T) {
	logits := FromF64([]float64{1, 2, 3, 0, 0, 0}, 2, 3)
	targets := FromI32([]int32{2, 0}, 2)
	got := CrossEntropy(logits, targets).Scalar()
	l0 := -math.Log(math.Exp(3) / (math.Exp(1) + math.Exp(2) + math.Exp(3)))
	l1 := math.Log(3)
	require.InDelta(t, (l0+l1)/2, got, 1e-12)
}

func TestOpErrors(t *testing.T) {
	w := FromF64(make([]float64, 8), 4, 2)
	require.PanicsWithValue(t, "tensor: token id 4 at position 1 is outside the vocabulary of 4",
		func() { Embedding(w, FromI32([]int32{0, 4}, 2)) })
	x := FromF64(make([]float64, 6), 2, 3)
	require.PanicsWithValue(t, "tensor: Linear of input [2 3] with weight [4 2] and bias none",
		func() { Linear(x, w, nil) })
	require.PanicsWithValue(t, "tensor: position 4 exceeds the 4 positions of the table (raise model.block_size)",
		func() { AddPositions(FromF64(make([]float64, 4), 1, 2, 2), w.Reshape(4, 2), []int{3, 4}) })
}
