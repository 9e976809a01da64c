package tensor

import (
	"fmt"
	"math"
	"math/rand"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/tensor/cpu"
)

// randF32 returns a float32 leaf with normal(0, std) entries.
func randF32(r *rand.Rand, std float64, shape ...int) *Tensor {
	t := Default.New(Params, Float32, shape...)
	for i := range t.f32 {
		t.f32[i] = float32(std * r.NormFloat64())
	}
	return t.RequiresGrad()
}

// rowsOf copies columns [c0, c0+n) of the rows at positions pos of a
// [B, T, W] tensor into a new leaf [B, len(pos), n] of the same dtype.
func rowsOf(x *Tensor, pos []int, c0, n int) *Tensor {
	B, T, W := x.shape[0], x.shape[1], x.shape[2]
	out := Default.New(Params, x.dtype, B, len(pos), n)
	for b := range B {
		for i, p := range pos {
			for c := range n {
				out.Set((b*len(pos)+i)*n+c, x.At((b*T+p)*W+c0+c))
			}
		}
	}
	return out.RequiresGrad()
}

// addRows adds a [B, len(pos), n] gradient back into columns [c0, c0+n) of
// the rows at pos of a flat [B, T, W] float64 buffer.
func addRows(dst []float64, T, W int, g *Tensor, pos []int, c0 int) {
	B, n := g.shape[0], g.shape[2]
	for b := range B {
		for i, p := range pos {
			for c := range n {
				dst[(b*T+p)*W+c0+c] += g.At((b*len(pos)+i)*n + c)
			}
		}
	}
}

// relDiff is the norm-wise relative difference ||got-want|| / ||want||.
func relDiff(got, want []float64) float64 {
	var num, den float64
	for i := range want {
		num += (got[i] - want[i]) * (got[i] - want[i])
		den += want[i] * want[i]
	}
	return math.Sqrt(num) / math.Max(math.Sqrt(den), 1e-300)
}

// layoutPositions splits positions 0..T-1 over cp ranks and returns each
// rank's positions, ascending: contiguous gives rank r chunk r of cp chunks;
// zigzag cuts 2cp chunks and gives rank r chunks r and 2cp-1-r, which
// balances the causal work.
func layoutPositions(T, cp int, zigzag bool) [][]int {
	chunks := cp
	if zigzag {
		chunks = 2 * cp
	}
	size := T / chunks
	chunk := func(c int) []int {
		var p []int
		for i := c * size; i < (c+1)*size; i++ {
			p = append(p, i)
		}
		return p
	}
	ranks := make([][]int, cp)
	for r := range cp {
		ranks[r] = chunk(r)
		if zigzag {
			ranks[r] = append(ranks[r], chunk(2*cp-1-r)...)
		}
	}
	return ranks
}

// TestBlockAttentionEqualsWhole splits a sequence over 2, 3 and 4 "ranks"
// (contiguous and zigzag), has every rank attend with its queries over the
// key blocks of all ranks (its own block first, then the others in ring
// order), and checks that the outputs are the rows of the whole sequence's
// SelfAttention and that the gradients, added back into the whole qkv, are
// the whole sequence's gradient: norm-wise within 1e-6 in float32.
func TestBlockAttentionEqualsWhole(t *testing.T) {
	const B, T, C, NH = 2, 24, 8, 2
	for _, cp := range []int{2, 3, 4} {
		for _, zigzag := range []bool{false, true} {
			t.Run(fmt.Sprintf("cp%d_zigzag_%v", cp, zigzag), func(t *testing.T) {
				r := rand.New(rand.NewSource(int64(11 + cp)))
				qkv := randF32(r, 1, B, T, 3*C)
				g := randF32(r, 1, B, T, C)
				whole, lse := SelfAttention(qkv, NH, nil)
				lse.Release()
				_, err := Backward(whole, g, BackwardOptions{})
				require.NoError(t, err)

				ranks := layoutPositions(T, cp, zigzag)
				grad := make([]float64, B*T*3*C)
				for rank, qpos := range ranks {
					q := rowsOf(qkv, qpos, 0, C)
					var blocks []KVBlock
					for s := range cp {
						src := ranks[(rank-s+cp)%cp]
						blocks = append(blocks, KVBlock{K: rowsOf(qkv, src, C, C), V: rowsOf(qkv, src, 2*C, C), Pos: src})
					}
					out := BlockAttention(q, qpos, blocks, NH)
					want := rowsOf(whole, qpos, 0, C)
					require.LessOrEqual(t, relDiff(out.Float64s(), want.Float64s()), 1e-6, "rank %d output", rank)

					_, err := Backward(out, rowsOf(g, qpos, 0, C), BackwardOptions{})
					require.NoError(t, err)
					addRows(grad, T, 3*C, q.Grad, qpos, 0)
					for s, b := range blocks {
						src := ranks[(rank-s+cp)%cp]
						addRows(grad, T, 3*C, b.K.Grad, src, C)
						addRows(grad, T, 3*C, b.V.Grad, src, 2*C)
					}
				}
				require.LessOrEqual(t, relDiff(grad, qkv.Grad.Float64s()), 1e-6, "gradient of qkv")
			})
		}
	}
}

// TestSelfAttentionPositions: SelfAttention at positions 0..T-1 is
// CausalSelfAttention, and only the order of the positions matters, not
// their values, when queries and keys are the same rows: shifted or gapped
// positions give bitwise the same output. The lse of a row equals the
// log-sum-exp of its scores computed here directly.
func TestSelfAttentionPositions(t *testing.T) {
	r := rand.New(rand.NewSource(21))
	qkv := randF32(r, 1, 2, 5, 3*6)
	want := CausalSelfAttention(qkv, 2).Float64s()
	for _, pos := range [][]int{nil, {0, 1, 2, 3, 4}, {100, 101, 102, 103, 104}, {3, 9, 10, 40, 41}} {
		out, lse := SelfAttention(qkv, 2, pos)
		require.Equal(t, want, out.Float64s(), "positions %v", pos)
		require.Equal(t, []int{2, 2, 5}, lse.Shape())
		// Batch 1, head 1, row 3 sees keys 0..3.
		var sum float64
		for j := 0; j <= 3; j++ {
			var dot float64
			for c := 3; c < 6; c++ {
				dot += qkv.At((5+3)*18+c) * qkv.At((5+j)*18+6+c)
			}
			sum += math.Exp(dot / math.Sqrt(3))
		}
		require.InDelta(t, math.Log(sum), lse.At((2+1)*5+3), 1e-5)
	}
}

func TestGradSelfAttentionPositions(t *testing.T) {
	r := rand.New(rand.NewSource(22))
	qkv := randT(r, 1, 2, 6, 3*6)
	gradCheck(t, "attention at zigzag positions", func() *Tensor {
		out, lse := SelfAttention(qkv, 2, []int{0, 1, 2, 9, 10, 11})
		lse.Release()
		return out
	}, qkv)
}

// TestGradBlockAttention checks BlockAttention's gradients w.r.t. q and
// every block's K and V by finite differences in float64: zigzag queries
// (chunks 0 and 3 of 4) over three key blocks, one of them in the queries'
// future for the first chunk and one entirely in their past.
func TestGradBlockAttention(t *testing.T) {
	r := rand.New(rand.NewSource(23))
	const B, C, NH = 2, 6, 2
	qpos := []int{0, 1, 2, 9, 10, 11}
	var blocks []KVBlock
	inputs := []*Tensor{randT(r, 1, B, len(qpos), C)}
	for _, pos := range [][]int{{3, 4, 5, 6, 7, 8}, {0, 1, 2, 9, 10, 11}, {12, 13}} {
		b := KVBlock{K: randT(r, 1, B, len(pos), C), V: randT(r, 1, B, len(pos), C), Pos: pos}
		blocks = append(blocks, b)
		inputs = append(inputs, b.K, b.V)
	}
	gradCheck(t, "block attention", func() *Tensor { return BlockAttention(inputs[0], qpos, blocks, NH) }, inputs...)
}

// TestBlockAttentionRelease: a backward with Release returns the output, the
// saved log-sum-exp and every gradient buffer to the allocator.
func TestBlockAttentionRelease(t *testing.T) {
	a := NewAllocator()
	r := rand.New(rand.NewSource(24))
	leaf := func(shape ...int) *Tensor {
		x := a.New(Params, Float32, shape...)
		for i := range x.f32 {
			x.f32[i] = float32(r.NormFloat64())
		}
		return x.RequiresGrad()
	}
	q := leaf(1, 4, 4)
	blocks := []KVBlock{{K: leaf(1, 2, 4), V: leaf(1, 2, 4), Pos: []int{0, 1}}, {K: leaf(1, 4, 4), V: leaf(1, 4, 4), Pos: []int{2, 3, 4, 5}}}
	before := a.Usage().Current[Activations]
	out := BlockAttention(q, []int{2, 3, 4, 5}, blocks, 2)
	loss := Sum(out)
	require.Greater(t, a.Usage().Current[Activations], before)
	_, err := Backward(loss, nil, BackwardOptions{Release: true, Alloc: a})
	require.NoError(t, err)
	loss.Release()
	require.Equal(t, before, a.Usage().Current[Activations], "every intermediate buffer is released")
	require.Equal(t, int64((16+8+8+16+16)*4), a.Usage().Current[Grads])
}

func TestAttentionErrors(t *testing.T) {
	qkv := FromF32(make([]float32, 3*18), 1, 3, 18)
	require.PanicsWithValue(t, "tensor: SelfAttention needs strictly ascending positions, but pos has 1 at index 2 after 5",
		func() { SelfAttention(qkv, 2, []int{0, 5, 1}) })
	require.PanicsWithValue(t, "tensor: SelfAttention has 2 positions in pos for 3 rows",
		func() { SelfAttention(qkv, 2, []int{0, 1}) })
	require.PanicsWithValue(t, "tensor: attention input [1 3 18] does not split into q, k, v of 4 heads",
		func() { SelfAttention(qkv, 4, nil) })
	q := FromF32(make([]float32, 12), 1, 2, 6)
	k := FromF32(make([]float32, 18), 1, 3, 6)
	require.PanicsWithValue(t, "tensor: BlockAttention needs at least one key/value block",
		func() { BlockAttention(q, []int{0, 1}, nil, 2) })
	require.PanicsWithValue(t, "tensor: BlockAttention block 0 has keys [1 3 6] and values [1 2 6] for queries [1 2 6]",
		func() { BlockAttention(q, []int{0, 1}, []KVBlock{{K: k, V: q, Pos: []int{0, 1, 2}}}, 2) })
	require.PanicsWithValue(t, "tensor: BlockAttention needs strictly ascending positions, but block 0 has 1 at index 1 after 2",
		func() { BlockAttention(q, []int{0, 1}, []KVBlock{{K: k, V: k, Pos: []int{2, 1, 3}}}, 2) })
	require.PanicsWithValue(t, "tensor: BlockAttention mixes Tensor(float32 [1 2 6]) and Tensor(float64 [1 3 6])",
		func() {
			BlockAttention(q, []int{0, 1}, []KVBlock{{K: k, V: FromF64(make([]float64, 18), 1, 3, 6), Pos: []int{0, 1, 2}}}, 2)
		})
}

// TestAttentionHalfProductsFollowCompute: on a bf16 or fp16 rank the
// attention ops run every product of the kernels in the compute dtype
// (cpu.AttnDims.HalfProducts): SelfAttention's, GroupedAttention's and
// BlockAttention's outputs are bitwise the kernel's with the format set,
// and outputs and gradients are within the format's bound of the float32
// rank's (1e-2 bf16, 2e-3 fp16) and not equal to them.
func TestAttentionHalfProductsFollowCompute(t *testing.T) {
	const B, T, NH, HS = 2, 70, 2, 8
	C := NH * HS
	r := rand.New(rand.NewSource(27))
	x := make([]float32, B*T*3*C)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	g := make([]float32, B*T*C)
	for i := range g {
		g[i] = float32(r.NormFloat64())
	}
	// run returns the outputs and qkv gradients of the three ops on a rank
	// computing in d (GroupedAttention with as many key/value heads as
	// query heads, BlockAttention over two key blocks).
	run := func(d DType) (outs, grads [][]float64) {
		a := NewAllocator()
		a.SetCompute(d)
		leaf := func(data []float32, shape ...int) *Tensor {
			t := a.New(Params, Float32, shape...)
			copy(t.F32(), data)
			return t.RequiresGrad()
		}
		gt := a.New(Activations, Float32, B, T, C)
		copy(gt.F32(), g)
		// cols is the leaf of columns [c0, c0+n) of rows [r0, r1) of x.
		cols := func(r0, r1, c0, n int) *Tensor {
			var data []float32
			for b := range B {
				for i := r0; i < r1; i++ {
					data = append(data, x[(b*T+i)*3*C+c0:][:n]...)
				}
			}
			return leaf(data, B, r1-r0, n)
		}
		for _, name := range []string{"SelfAttention", "GroupedAttention", "BlockAttention"} {
			qkv := leaf(x, B, T, 3*C)
			var out *Tensor
			var leaves []*Tensor
			switch name {
			case "SelfAttention":
				var lse *Tensor
				out, lse = SelfAttention(qkv, NH, nil)
				lse.Release()
				leaves = []*Tensor{qkv}
			case "GroupedAttention":
				out = GroupedAttention(qkv, NH, NH, nil)
				leaves = []*Tensor{qkv}
			default:
				pos := make([]int, T)
				for i := range pos {
					pos[i] = i
				}
				q, k1, v1, k2, v2 := cols(0, T, 0, C), cols(0, 30, C, C), cols(0, 30, 2*C, C), cols(30, T, C, C), cols(30, T, 2*C, C)
				out = BlockAttention(q, pos, []KVBlock{{K: k2, V: v2, Pos: pos[30:]}, {K: k1, V: v1, Pos: pos[:30]}}, NH)
				leaves = []*Tensor{q, k1, v1, k2, v2}
			}
			outs = append(outs, out.Float64s())
			_, err := Backward(out, gt, BackwardOptions{})
			require.NoError(t, err)
			var grad []float64
			for _, l := range leaves {
				grad = append(grad, l.Grad.Float64s()...)
			}
			grads = append(grads, grad)
		}
		return outs, grads
	}
	outs, grads := run(Float32)
	for _, c := range []struct {
		d   DType
		f   cpu.HalfFormat
		tol float64
	}{{BFloat16, cpu.BF16, 1e-2}, {Float16, cpu.F16, 2e-3}} {
		hOuts, hGrads := run(c.d)
		d := cpu.AttnDims{B: B, NH: NH, HS: HS, Tq: T, Tk: T, LdQ: 3 * C, LdK: 3 * C, LdV: 3 * C, LdO: C, HalfProducts: c.f}
		want := make([]float32, B*T*C)
		pos := make([]int, T)
		for i := range pos {
			pos[i] = i
		}
		cpu.AttentionPosForward(d, x, x[C:], x[2*C:], pos, pos, want, nil, nil)
		for i, name := range []string{"SelfAttention", "GroupedAttention", "BlockAttention"} {
			if name != "BlockAttention" { // merged from two blocks: another order of sums
				require.Equal(t, FromF32(want, B, T, C).Float64s(), hOuts[i], "%s %s: the kernel with HalfProducts", c.d, name)
			}
			for what, p := range map[string][2][]float64{"out": {hOuts[i], outs[i]}, "grad": {hGrads[i], grads[i]}} {
				e := relNorm(p[0], p[1])
				require.LessOrEqual(t, e, c.tol, "%s %s %s", c.d, name, what)
				require.Greater(t, e, 0.0, "%s %s %s: the half products changed nothing", c.d, name, what)
			}
		}
	}
}
