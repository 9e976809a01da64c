package cpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// refAttnPos is attention over positions written as plain float64 loops:
// per head and query row, scores over the keys with kpos <= qpos, softmax,
// weighted sum of values. It returns out (stride LdO), att [B, NH, Tq, Tk]
// and lse [B, NH, Tq] (-Inf and a zero output for rows that see no key).
func refAttnPos(d AttnDims, q, k, v []float64, qpos, kpos []int) (out, att, lse []float64) {
	out = make([]float64, d.B*d.Tq*d.LdO)
	att = make([]float64, d.B*d.NH*d.Tq*d.Tk)
	lse = make([]float64, d.B*d.NH*d.Tq)
	for b := range d.B {
		for h := range d.NH {
			for i := range d.Tq {
				bhi := (b*d.NH+h)*d.Tq + i
				p := att[bhi*d.Tk : (bhi+1)*d.Tk]
				mx := math.Inf(-1)
				for j := range d.Tk {
					if kpos[j] > qpos[i] {
						continue
					}
					var dot float64
					for c := range d.HS {
						dot += q[(b*d.Tq+i)*d.LdQ+h*d.HS+c] * k[(b*d.Tk+j)*d.LdK+h*d.HS+c]
					}
					p[j] = dot / math.Sqrt(float64(d.HS))
					mx = math.Max(mx, p[j])
				}
				if math.IsInf(mx, -1) {
					lse[bhi] = mx
					continue
				}
				var sum float64
				for j := range d.Tk {
					if kpos[j] <= qpos[i] {
						sum += math.Exp(p[j] - mx)
					}
				}
				lse[bhi] = mx + math.Log(sum)
				for j := range d.Tk {
					if kpos[j] > qpos[i] {
						continue
					}
					p[j] = math.Exp(p[j] - lse[bhi])
					for c := range d.HS {
						out[(b*d.Tq+i)*d.LdO+h*d.HS+c] += p[j] * v[(b*d.Tk+j)*d.LdV+h*d.HS+c]
					}
				}
			}
		}
	}
	return out, att, lse
}

// refAttnPosBackward differentiates refAttnPos by hand, loop by loop,
// through the plain softmax backward with rowsum(P∘dP).
func refAttnPosBackward(d AttnDims, dout, q, k, v, att []float64) (dq, dk, dv []float64) {
	dq = make([]float64, d.B*d.Tq*d.LdQ)
	dk = make([]float64, d.B*d.Tk*d.LdK)
	dv = make([]float64, d.B*d.Tk*d.LdV)
	scale := 1 / math.Sqrt(float64(d.HS))
	for b := range d.B {
		for h := range d.NH {
			for i := range d.Tq {
				p := att[((b*d.NH+h)*d.Tq+i)*d.Tk:]
				dp := make([]float64, d.Tk)
				var dot float64
				for j := range d.Tk {
					for c := range d.HS {
						g := dout[(b*d.Tq+i)*d.LdO+h*d.HS+c]
						dp[j] += g * v[(b*d.Tk+j)*d.LdV+h*d.HS+c]
						dv[(b*d.Tk+j)*d.LdV+h*d.HS+c] += p[j] * g
					}
					dot += p[j] * dp[j]
				}
				for j := range d.Tk {
					ds := p[j] * (dp[j] - dot) * scale
					for c := range d.HS {
						dq[(b*d.Tq+i)*d.LdQ+h*d.HS+c] += ds * k[(b*d.Tk+j)*d.LdK+h*d.HS+c]
						dk[(b*d.Tk+j)*d.LdK+h*d.HS+c] += ds * q[(b*d.Tq+i)*d.LdQ+h*d.HS+c]
					}
				}
			}
		}
	}
	return dq, dk, dv
}

// posCase is one layout of queries and keys for the kernel tests.
type posCase struct {
	name       string
	qpos, kpos []int
}

func seq(lo, hi int) []int { return identity(hi)[lo:] }

func cat(parts ...[]int) []int {
	var out []int
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// posCases covers the masks a block of keys can put on a block of queries:
// the whole causal sequence, zigzag chunks, keys all in the past, on the
// diagonal, all in the future, Tq != Tk, and rows that see no key. Some
// cases span more than one row block of attnBlock rows.
func posCases() []posCase {
	return []posCase{
		{"contiguous", seq(0, 70), seq(0, 70)},
		{"contiguous_long", seq(0, 130), seq(0, 130)},
		// A zigzag rank of 4 chunks of 20: chunks 0 and 3 as queries.
		{"zigzag_self", cat(seq(0, 20), seq(60, 80)), cat(seq(0, 20), seq(60, 80))},
		{"zigzag_other", cat(seq(0, 20), seq(60, 80)), seq(20, 60)},
		{"zigzag_long", cat(seq(0, 40), seq(120, 160)), cat(seq(0, 40), seq(40, 80), seq(120, 160))},
		{"past", seq(80, 150), seq(0, 70)},
		{"diagonal_offset", seq(40, 110), seq(30, 100)},
		{"future", seq(0, 9), seq(9, 20)},
		{"no_key_first_rows", seq(0, 75), cat(seq(5, 8), seq(70, 140))},
		{"sparse", []int{3, 10, 11, 40, 90}, []int{0, 4, 10, 12, 13, 50, 60, 70, 71, 72, 73}},
		{"no_keys", seq(0, 5), nil},
	}
}

// posInputs draws q, k, v and dout for a case with padded row strides, so
// the kernels must honour LdQ, LdK, LdV and LdO.
func posInputs[F Float](c posCase, B, NH, HS int, seed uint64) (d AttnDims, q, k, v, dout []F) {
	w := NH * HS
	d = AttnDims{B: B, NH: NH, HS: HS, Tq: len(c.qpos), Tk: len(c.kpos), LdQ: w + 1, LdK: w + 3, LdV: w, LdO: w + 2}
	rng := newRNG(seed)
	q = randSlice[F](rng, B*d.Tq*d.LdQ, 2)
	k = randSlice[F](rng, B*d.Tk*d.LdK, 2)
	v = randSlice[F](rng, B*d.Tk*d.LdV, 1)
	dout = randSlice[F](rng, B*d.Tq*d.LdO, 1)
	return
}

// colsOf returns the first w columns of each row of stride ld.
func colsOf[F Float](x []F, ld, w int) []F {
	var out []F
	for r := 0; r+w <= len(x); r += ld {
		out = append(out, x[r:r+w]...)
	}
	return out
}

func testAttentionPosForward[F Float](t *testing.T) {
	for _, c := range posCases() {
		t.Run(c.name, func(t *testing.T) {
			d, q, k, v, _ := posInputs[F](c, 2, 3, 4, 41)
			out := randSlice[F](newRNG(1), d.B*d.Tq*d.LdO, 1) // garbage: must be overwritten
			att := randSlice[F](newRNG(2), d.B*d.NH*d.Tq*d.Tk, 1)
			lse := randSlice[F](newRNG(3), d.B*d.NH*d.Tq, 1)
			AttentionPosForward(d, q, k, v, c.qpos, c.kpos, out, att, lse)
			wantOut, wantAtt, wantLSE := refAttnPos(d, to64(q), to64(k), to64(v), c.qpos, c.kpos)
			w := d.NH * d.HS
			tol := tolFor[F](1e-6, 1e-13)
			requireClose(t, colsOf(out, d.LdO, w), colsOf(wantOut, d.LdO, w), tol, "out")
			requireClose(t, att, wantAtt, tol, "att")
			for i, want := range wantLSE {
				if math.IsInf(want, -1) {
					require.True(t, math.IsInf(float64(lse[i]), -1), "lse %d of a row with no key is %v", i, lse[i])
					continue
				}
				require.InDelta(t, want, float64(lse[i]), tolFor[F](1e-5, 1e-12)*math.Max(1, math.Abs(want)), "lse %d", i)
			}
			// att may be nil: the output and lse are the same.
			out2, lse2 := make([]F, len(out)), make([]F, len(lse))
			AttentionPosForward(d, q, k, v, c.qpos, c.kpos, out2, nil, lse2)
			require.Equal(t, colsOf(out, d.LdO, w), colsOf(out2, d.LdO, w), "out without att")
			require.Equal(t, lse, lse2, "lse without att")
		})
	}
}

func TestAttentionPosForward(t *testing.T) {
	t.Run("float32", testAttentionPosForward[float32])
	t.Run("float64", testAttentionPosForward[float64])
}

func testAttentionPosBackward[F Float](t *testing.T) {
	for _, c := range posCases() {
		t.Run(c.name, func(t *testing.T) {
			d, q, k, v, dout := posInputs[F](c, 2, 3, 4, 42)
			out, att := make([]F, d.B*d.Tq*d.LdO), make([]F, d.B*d.NH*d.Tq*d.Tk)
			AttentionPosForward(d, q, k, v, c.qpos, c.kpos, out, att, nil)
			// Accumulation on top of old values.
			rng := newRNG(43)
			dq, dk, dv := randSlice[F](rng, len(q), 1), randSlice[F](rng, len(k), 1), randSlice[F](rng, len(v), 1)
			old := [][]float64{to64(dq), to64(dk), to64(dv)}
			AttentionPosBackward(d, dout, q, k, v, att, c.qpos, c.kpos, dq, dk, dv)
			_, att64, _ := refAttnPos(d, to64(q), to64(k), to64(v), c.qpos, c.kpos)
			wq, wk, wv := refAttnPosBackward(d, to64(dout), to64(q), to64(k), to64(v), att64)
			tol := tolFor[F](2e-6, 1e-12)
			for i, p := range [][2][]float64{{wq, old[0]}, {wk, old[1]}, {wv, old[2]}} {
				for j := range p[0] {
					p[0][j] += p[1][j]
				}
				got := [][]F{dq, dk, dv}[i]
				requireClose(t, got, p[0], tol, []string{"dq", "dk", "dv"}[i])
			}
		})
	}
}

func TestAttentionPosBackward(t *testing.T) {
	t.Run("float32", testAttentionPosBackward[float32])
	t.Run("float64", testAttentionPosBackward[float64])
}

// splitKeys cuts a case's keys into n blocks of consecutive keys (their
// positions stay ascending within each block).
func splitKeys(kpos []int, n int) [][2]int {
	var blocks [][2]int
	for i := range n {
		blocks = append(blocks, [2]int{i * len(kpos) / n, (i + 1) * len(kpos) / n})
	}
	return blocks
}

// blockwise runs the attention of a case block by block: forward of each key
// block merged through the log-sum-exp, then the backward of each block
// from the final lse. Block order is reversed, as a ring may deliver them.
func blockwise[F Float](d AttnDims, c posCase, nb int, q, k, v, dout []F) (out, lse, dq, dk, dv []F) {
	out, lse = make([]F, d.B*d.Tq*d.LdO), make([]F, d.B*d.NH*d.Tq)
	dq, dk, dv = make([]F, len(q)), make([]F, len(k)), make([]F, len(v))
	blocks := splitKeys(c.kpos, nb)
	// kb copies rows [lo,hi) of every batch element of a key buffer.
	kb := func(x []F, ld int, blk [2]int) []F {
		var r []F
		for b := range d.B {
			r = append(r, x[(b*d.Tk+blk[0])*ld:(b*d.Tk+blk[1])*ld]...)
		}
		return r
	}
	// unkb adds rows back.
	unkb := func(dst, src []F, ld int, blk [2]int) {
		n := blk[1] - blk[0]
		for b := range d.B {
			for i, x := range src[b*n*ld : (b+1)*n*ld] {
				dst[(b*d.Tk+blk[0])*ld+i] += x
			}
		}
	}
	for n := len(blocks) - 1; n >= 0; n-- {
		blk := blocks[n]
		db := d
		db.Tk = blk[1] - blk[0]
		kpos := c.kpos[blk[0]:blk[1]]
		if n == len(blocks)-1 {
			AttentionPosForward(db, q, kb(k, d.LdK, blk), kb(v, d.LdV, blk), c.qpos, kpos, out, nil, lse)
			continue
		}
		outB, lseB := make([]F, len(out)), make([]F, len(lse))
		AttentionPosForward(db, q, kb(k, d.LdK, blk), kb(v, d.LdV, blk), c.qpos, kpos, outB, nil, lseB)
		AttentionMerge(d, out, lse, outB, lseB)
	}
	delta := make([]F, len(lse))
	AttentionDelta(d, dout, out, delta)
	for n := len(blocks) - 1; n >= 0; n-- {
		blk := blocks[n]
		db := d
		db.Tk = blk[1] - blk[0]
		bk, bv := kb(k, d.LdK, blk), kb(v, d.LdV, blk)
		gk, gv := make([]F, len(bk)), make([]F, len(bv))
		AttentionLSEBackward(db, dout, q, bk, bv, delta, lse, c.qpos, c.kpos[blk[0]:blk[1]], dq, gk, gv)
		unkb(dk, gk, d.LdK, blk)
		unkb(dv, gv, d.LdV, blk)
	}
	return
}

// TestAttentionBlocksMergeExactly computes attention over 1 to 4 key blocks
// with AttentionMerge and AttentionLSEBackward and compares with the float64
// reference of the whole key set.
func testAttentionBlocks[F Float](t *testing.T) {
	for _, c := range posCases() {
		for _, nb := range []int{1, 2, 3, 4} {
			t.Run(fmt.Sprintf("%s/%d_blocks", c.name, nb), func(t *testing.T) {
				d, q, k, v, dout := posInputs[F](c, 2, 2, 4, 44)
				out, lse, dq, dk, dv := blockwise(d, c, nb, q, k, v, dout)
				wantOut, att, wantLSE := refAttnPos(d, to64(q), to64(k), to64(v), c.qpos, c.kpos)
				wq, wk, wv := refAttnPosBackward(d, to64(dout), to64(q), to64(k), to64(v), att)
				w := d.NH * d.HS
				requireClose(t, colsOf(out, d.LdO, w), colsOf(wantOut, d.LdO, w), tolFor[F](1e-6, 1e-13), "out")
				for i, want := range wantLSE {
					if math.IsInf(want, -1) {
						require.True(t, math.IsInf(float64(lse[i]), -1), "lse %d of a row with no key is %v", i, lse[i])
					} else {
						require.InDelta(t, want, float64(lse[i]), tolFor[F](1e-5, 1e-12)*math.Max(1, math.Abs(want)), "lse %d", i)
					}
				}
				tol := tolFor[F](2e-6, 1e-12)
				requireClose(t, dq, wq, tol, "dq")
				requireClose(t, dk, wk, tol, "dk")
				requireClose(t, dv, wv, tol, "dv")
			})
		}
	}
}

func TestAttentionBlocks(t *testing.T) {
	t.Run("float32", testAttentionBlocks[float32])
	t.Run("float64", testAttentionBlocks[float64])
}

func TestAttentionMergeEmptyRows(t *testing.T) {
	d := AttnDims{B: 1, NH: 1, HS: 2, Tq: 3, Tk: 0, LdQ: 2, LdK: 2, LdV: 2, LdO: 2}
	inf := math.Inf(-1)
	out := []float64{1, 2, 0, 0, 5, 6}
	lse := []float64{math.Log(2), inf, inf}
	outB := []float64{0, 0, 3, 4, 0, 0}
	lseB := []float64{inf, math.Log(3), inf}
	AttentionMerge(d, out, lse, outB, lseB)
	// Row 0 keeps its values, row 1 takes B's, row 2 sees nothing: zero.
	require.Equal(t, []float64{1, 2, 3, 4, 0, 0}, out)
	require.Equal(t, []float64{math.Log(2), math.Log(3), inf}, lse)

	out = []float64{1, 2}
	lse = []float64{math.Log(1)}
	d.Tq = 1
	AttentionMerge(d, out, lse, []float64{4, 8}, []float64{math.Log(3)})
	// Weights 1/4 and 3/4 of the total mass 4.
	require.InDeltaSlice(t, []float64{0.25*1 + 0.75*4, 0.25*2 + 0.75*8}, out, 1e-15)
	require.InDelta(t, math.Log(4), lse[0], 1e-15)
}

// TestAttentionBlocksFiniteDifferences differentiates L = Σ g∘out of the
// block-merged attention numerically in float64, for a zigzag query set
// over 3 key blocks.
func TestAttentionBlocksFiniteDifferences(t *testing.T) {
	c := posCase{"zigzag", cat(seq(0, 3), seq(9, 12)), seq(0, 12)}
	d, q, k, v, g := posInputs[float64](c, 1, 2, 3, 45)
	_, _, dq, dk, dv := blockwise(d, c, 3, q, k, v, g)
	loss := func() float64 {
		out, _, _, _, _ := blockwise(d, c, 3, q, k, v, g)
		var s float64
		for i := range out {
			if i%d.LdO < d.NH*d.HS {
				s += g[i] * out[i]
			}
		}
		return s
	}
	for n, x := range [][]float64{q, k, v} {
		num := make([]float64, len(x))
		for i := range x {
			old := x[i]
			x[i] = old + 1e-6
			lp := loss()
			x[i] = old - 1e-6
			lm := loss()
			x[i] = old
			num[i] = (lp - lm) / 2e-6
		}
		requireClose(t, [][]float64{dq, dk, dv}[n], num, 1e-8, []string{"dq", "dk", "dv"}[n])
	}
}

func TestAttentionPosBadInput(t *testing.T) {
	d := AttnDims{B: 1, NH: 1, HS: 2, Tq: 3, Tk: 3, LdQ: 2, LdK: 2, LdV: 2, LdO: 2}
	buf := func(n int) []float32 { return make([]float32, n) }
	require.PanicsWithValue(t, "cpu.AttentionPosForward: kpos is not strictly ascending: position 1 at index 2 follows 4 (put the rows in position order)",
		func() {
			AttentionPosForward(d, buf(6), buf(6), buf(6), []int{0, 1, 2}, []int{0, 4, 1}, buf(6), nil, nil)
		})
	require.PanicsWithValue(t, "cpu.AttentionLSEBackward: qpos has 2 positions for 3 rows",
		func() {
			AttentionLSEBackward(d, buf(6), buf(6), buf(6), buf(6), buf(3), buf(3), []int{0, 1}, []int{0, 1, 2}, buf(6), buf(6), buf(6))
		})
	require.PanicsWithValue(t, "cpu.AttentionPosBackward: att has 8 elements, need 9 for {B:1 NH:1 HS:2 Tq:3 Tk:3 LdQ:2 LdK:2 LdV:2 LdO:2 KVH:0}",
		func() {
			AttentionPosBackward(d, buf(6), buf(6), buf(6), buf(6), buf(8), []int{0, 1, 2}, []int{0, 1, 2}, buf(6), buf(6), buf(6))
		})
	bad := d
	bad.LdO = 1
	require.PanicsWithValue(t, "cpu.AttentionMerge: bad dimensions {B:1 NH:1 HS:2 Tq:3 Tk:3 LdQ:2 LdK:2 LdV:2 LdO:1 KVH:0}; need B, Tq, Tk >= 0, NH, HS >= 1, KVH dividing NH and row strides >= NH*HS (k, v: KVH*HS)",
		func() { AttentionMerge(bad, buf(6), buf(3), buf(6), buf(3)) })
}

// halfFormats are the formats of HalfProducts with their rounding, a
// relative perturbation every value of the format rounds back from (a
// quarter of its unit in the last place), and the norm-wise bound of
// the kernel tests (1e-2 for bf16's 8-bit significand, 2e-3 for
// fp16's 11 bits).
var halfFormats = []struct {
	name  string
	f     HalfFormat
	round func([]float32)
	nudge float32
	tol   float64
}{
	{"bf16", BF16, RoundBF16, 0x1p-10, 1e-2},
	{"fp16", F16, RoundF16, 0x1p-13, 2e-3},
}

// TestAttentionHalfProducts: with HalfProducts the attention, forward and
// backward, over 1 and 3 key blocks, is within the half format's bound
// of the float64 reference on the same inputs.
func TestAttentionHalfProducts(t *testing.T) {
	for _, hf := range halfFormats {
		for _, c := range posCases() {
			for _, hs := range []int{4, 64} {
				for _, nb := range []int{1, 3} {
					t.Run(fmt.Sprintf("%s/%s/hs%d/%d_blocks", hf.name, c.name, hs, nb), func(t *testing.T) {
						d, q, k, v, dout := posInputs[float32](c, 2, 2, hs, 45)
						w := d.NH * d.HS
						d.HalfProducts = hf.f
						out, lse, dq, dk, dv := blockwise(d, c, nb, q, k, v, dout)
						wantOut, att, wantLSE := refAttnPos(d, to64(q), to64(k), to64(v), c.qpos, c.kpos)
						wq, wk, wv := refAttnPosBackward(d, to64(dout), to64(q), to64(k), to64(v), att)
						requireClose(t, colsOf(out, d.LdO, w), colsOf(wantOut, d.LdO, w), hf.tol, "out")
						for i, want := range wantLSE {
							if !math.IsInf(want, -1) {
								require.InDelta(t, want, float64(lse[i]), hf.tol*math.Max(1, math.Abs(want)), "lse %d", i)
							}
						}
						requireClose(t, dq, wq, hf.tol, "dq")
						requireClose(t, dk, wk, hf.tol, "dk")
						requireClose(t, dv, wv, hf.tol, "dv")
					})
				}
			}
		}
	}
}

// TestAttentionHalfProductsRoundEveryOperand: each of the six products
// rounds the operands it reads from outside to the half format. q, k, v
// and dout hold values of the format; nudged by a quarter of their last
// place, they round back to the same numbers. So with HalfProducts:
//
//   - nudging q, k and v changes no bit of out, lse, dq, dk or dv: the
//     scores read q and k, P v reads v, dP = dout v^T reads v, dq = dS k
//     reads k, dk = dS^T q reads q (P, dP and dS are computed from the
//     products' results alone);
//   - nudging dout changes no bit of dv = P^T dout (dq and dk move: delta
//     = rowsum(dout∘out) is float32).
//
// A product left in float32 reads the nudged values and moves its result;
// the float32 attention (NoHalf), checked alongside, does move every one.
func TestAttentionHalfProductsRoundEveryOperand(t *testing.T) {
	c := posCase{"zigzag", cat(seq(0, 70), seq(210, 280)), cat(seq(0, 70), seq(70, 140), seq(210, 280))}
	for _, hf := range halfFormats {
		for _, nb := range []int{1, 3} {
			t.Run(fmt.Sprintf("%s/%d_blocks", hf.name, nb), func(t *testing.T) {
				d, q, k, v, dout := posInputs[float32](c, 2, 2, 32, 47)
				for _, x := range [][]float32{q, k, v, dout} {
					hf.round(x)
				}
				nudged := func(x []float32) []float32 {
					y := append([]float32(nil), x...)
					for i := range y {
						y[i] += y[i] * hf.nudge
					}
					hf.round(y)
					require.Equal(t, x, y, "the nudge rounds back")
					for i := range y {
						y[i] += y[i] * hf.nudge
					}
					return y
				}
				nq, nk, nv, ndout := nudged(q), nudged(k), nudged(v), nudged(dout)
				// run returns out, lse, dq, dk and dv of the blocks' path,
				// then of the stored probabilities' (AttentionPosBackward).
				run := func(q, k, v, dout []float32) [][]float32 {
					out, lse, dq, dk, dv := blockwise(d, c, nb, q, k, v, dout)
					sout, att, slse := make([]float32, len(out)), make([]float32, d.B*d.NH*d.Tq*d.Tk), make([]float32, len(lse))
					AttentionPosForward(d, q, k, v, c.qpos, c.kpos, sout, att, slse)
					sq, sk, sv := make([]float32, len(q)), make([]float32, len(k)), make([]float32, len(v))
					AttentionPosBackward(d, dout, q, k, v, att, c.qpos, c.kpos, sq, sk, sv)
					return [][]float32{out, lse, dq, dk, dv, sout, slse, sq, sk, sv}
				}
				names := []string{"out", "lse", "dq", "dk", "dv"}
				for _, f := range []HalfFormat{NoHalf, hf.f} {
					d.HalfProducts = f
					base, moved := run(q, k, v, dout), run(nq, nk, nv, dout)
					for i := range base {
						what := fmt.Sprintf("%s (%s path)", names[i%5], []string{"blocks'", "stored probabilities'"}[i/5])
						if f == NoHalf {
							require.NotEqual(t, base[i], moved[i], "float32 %s moves with q, k, v", what)
						} else {
							require.Equal(t, base[i], moved[i], "%s of the half products reads q, k, v rounded", what)
						}
					}
					moved = run(q, k, v, ndout)
					for _, i := range []int{4, 9} {
						if f == NoHalf {
							require.NotEqual(t, base[i], moved[i], "float32 dv moves with dout")
						} else {
							require.Equal(t, base[i], moved[i], "dv = P^T dout of the half products reads dout rounded")
						}
					}
				}
			})
		}
	}
}

// TestAttentionPosDeterministic: every kernel over positions, with float32
// products and with the half products, gives bitwise the same results at
// 1, 2 and 3 threads.
func TestAttentionPosDeterministic(t *testing.T) {
	c := posCase{"zigzag", cat(seq(0, 70), seq(210, 280)), cat(seq(0, 70), seq(70, 140), seq(210, 280))}
	for _, f := range []HalfFormat{NoHalf, BF16, F16} {
		d, q, k, v, dout := posInputs[float32](c, 2, 4, 8, 46)
		d.HalfProducts = f
		run := func(n int) (res [][]float32) {
			withThreads(n, func() {
				out, att, lse := make([]float32, d.B*d.Tq*d.LdO), make([]float32, d.B*d.NH*d.Tq*d.Tk), make([]float32, d.B*d.NH*d.Tq)
				AttentionPosForward(d, q, k, v, c.qpos, c.kpos, out, att, lse)
				dq, dk, dv := make([]float32, len(q)), make([]float32, len(k)), make([]float32, len(v))
				AttentionPosBackward(d, dout, q, k, v, att, c.qpos, c.kpos, dq, dk, dv)
				bo, bl, bq, bk, bv := blockwise(d, c, 3, q, k, v, dout)
				res = [][]float32{out, att, lse, dq, dk, dv, bo, bl, bq, bk, bv}
			})
			return
		}
		r1 := run(1)
		for _, n := range []int{2, 3} {
			rn := run(n)
			for i := range r1 {
				require.Equal(t, r1[i], rn[i], "half format %d (0 float32, 1 bf16, 2 fp16): result %d with %d threads", f, i, n)
			}
		}
	}
}

// TestAttentionLSEGradSets checks that AttentionLSEGrad writes every
// element of each head's columns of dq, dk and dv, bit for bit what
// AttentionLSEBackward adds into zeros: its buffers start as NaN, so an
// element it failed to write, or read before writing, shows. The cases
// cover row blocks that see no key (cleared dq), keys no query sees
// (cleared dk and dv), no keys at all, and key/value groups, whose later
// heads add to what the first one set.
func TestAttentionLSEGradSets(t *testing.T) {
	testAttentionLSEGradSets[float32](t, NoHalf)
	testAttentionLSEGradSets[float32](t, BF16)
	testAttentionLSEGradSets[float32](t, F16)
	testAttentionLSEGradSets[float64](t, NoHalf)
}

func testAttentionLSEGradSets[F Float](t *testing.T, f HalfFormat) {
	bits := func(x []F) []uint64 {
		b := make([]uint64, len(x))
		for i, v := range x {
			b[i] = math.Float64bits(float64(v))
		}
		return b
	}
	nans := func(n int) []F {
		x := make([]F, n)
		for i := range x {
			x[i] = F(math.NaN())
		}
		return x
	}
	for _, c := range posCases() {
		for _, kvh := range []int{0, 2} {
			d, q, k, v, dout := posInputs[F](c, 2, 4, 8, 53)
			d.HalfProducts, d.KVH = f, kvh
			out, lse, delta := make([]F, d.B*d.Tq*d.LdO), make([]F, d.B*d.NH*d.Tq), make([]F, d.B*d.NH*d.Tq)
			AttentionPosForward(d, q, k, v, c.qpos, c.kpos, out, nil, lse)
			AttentionDelta(d, dout, out, delta)
			dq, dk, dv := make([]F, len(q)), make([]F, len(k)), make([]F, len(v))
			AttentionLSEBackward(d, dout, q, k, v, delta, lse, c.qpos, c.kpos, dq, dk, dv)
			sq, sk, sv := nans(len(q)), nans(len(k)), nans(len(v))
			AttentionLSEGrad(d, dout, q, k, v, delta, lse, c.qpos, c.kpos, sq, sk, sv)
			w, kw := d.NH*d.HS, d.kvHeads()*d.HS
			name := fmt.Sprintf("%s, KVH %d, half format %d", c.name, kvh, f)
			require.Equal(t, bits(colsOf(dq, d.LdQ, w)), bits(colsOf(sq, d.LdQ, w)), "dq: %s", name)
			require.Equal(t, bits(colsOf(dk, d.LdK, kw)), bits(colsOf(sk, d.LdK, kw)), "dk: %s", name)
			require.Equal(t, bits(colsOf(dv, d.LdV, kw)), bits(colsOf(sv, d.LdV, kw)), "dv: %s", name)
		}
	}
}

// TestAttentionKernelRowBlock checks that the narrower row blocks of the
// bf16 kernel change no bit of the attention: forward (probabilities,
// output, log-sum-exp) and both backwards agree bit for bit with the
// products run in row blocks of attnBlock, over the masks of posCases, a
// sequence longer than one of the kernel's 256-term sums, and key/value
// groups.
func TestAttentionKernelRowBlock(t *testing.T) {
	if !bf16Kernel.Load() {
		t.Skip("the bf16 kernel does not run here (" + HalfGemmPath() + "); other paths keep attnBlock")
	}
	cases := append(posCases(), posCase{"long", seq(0, 300), seq(0, 300)})
	run := func(d AttnDims, c posCase, q, k, v, dout []float32) (res [][]float32) {
		out, att, lse := make([]float32, d.B*d.Tq*d.LdO), make([]float32, d.B*d.NH*d.Tq*d.Tk), make([]float32, d.B*d.NH*d.Tq)
		AttentionPosForward(d, q, k, v, c.qpos, c.kpos, out, att, lse)
		out2 := make([]float32, len(out))
		AttentionPosForward(d, q, k, v, c.qpos, c.kpos, out2, nil, lse)
		dq, dk, dv := make([]float32, len(q)), make([]float32, len(k)), make([]float32, len(v))
		AttentionPosBackward(d, dout, q, k, v, att, c.qpos, c.kpos, dq, dk, dv)
		delta := make([]float32, len(lse))
		AttentionDelta(d, dout, out2, delta)
		lq, lk, lv := make([]float32, len(q)), make([]float32, len(k)), make([]float32, len(v))
		AttentionLSEGrad(d, dout, q, k, v, delta, lse, c.qpos, c.kpos, lq, lk, lv)
		return [][]float32{out, att, out2, lse, dq, dk, dv, lq, lk, lv}
	}
	defer func(b int) { kernelRowBlock = b }(kernelRowBlock)
	require.Less(t, kernelRowBlock, attnBlock, "the kernel's row blocks are the narrower ones")
	for _, c := range cases {
		for _, kvh := range []int{0, 2} {
			d, q, k, v, dout := posInputs[float32](c, 2, 4, 8, 59)
			d.HalfProducts, d.KVH = BF16, kvh
			narrow := run(d, c, q, k, v, dout)
			kernelRowBlock = attnBlock
			wide := run(d, c, q, k, v, dout)
			kernelRowBlock = attnBlock / 2
			for i := range wide {
				require.Equal(t, wide[i], narrow[i], "%s, KVH %d: result %d", c.name, kvh, i)
			}
		}
	}
}
