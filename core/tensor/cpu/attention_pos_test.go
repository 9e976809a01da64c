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

// TestAttentionPosDeterministic: every kernel over positions gives bitwise
// the same results at 1, 2 and 3 threads.
func TestAttentionPosDeterministic(t *testing.T) {
	c := posCase{"zigzag", cat(seq(0, 70), seq(210, 280)), cat(seq(0, 70), seq(70, 140), seq(210, 280))}
	d, q, k, v, dout := posInputs[float32](c, 2, 4, 8, 46)
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
			require.Equal(t, r1[i], rn[i], "result %d with %d threads", i, n)
		}
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

// TestAttentionBF16Scores: with BF16Scores the scores are a bf16 product.
// On q and k that hold bf16 values (as mixed precision rounds them) it
// changes only the order of float32 sums, so forward and backward, over 1
// and 3 key blocks, match the float32 scores to 1e-5; on unrounded q and k
// it is within bf16's 1e-2 of the float64 reference.
func TestAttentionBF16Scores(t *testing.T) {
	for _, c := range posCases() {
		for _, hs := range []int{4, 64} {
			for _, nb := range []int{1, 3} {
				t.Run(fmt.Sprintf("%s/hs%d/%d_blocks", c.name, hs, nb), func(t *testing.T) {
					d, q, k, v, dout := posInputs[float32](c, 2, 2, hs, 45)
					w := d.NH * d.HS
					rq, rk := append([]float32(nil), q...), append([]float32(nil), k...)
					RoundBF16(rq)
					RoundBF16(rk)
					db := d
					db.BF16Scores = true
					out, lse, dq, dk, dv := blockwise(d, c, nb, rq, rk, v, dout)
					bout, blse, bdq, bdk, bdv := blockwise(db, c, nb, rq, rk, v, dout)
					requireClose(t, colsOf(bout, d.LdO, w), to64(colsOf(out, d.LdO, w)), 1e-5, "out")
					for i := range lse {
						require.InDelta(t, float64(lse[i]), float64(blse[i]), 1e-5*math.Max(1, math.Abs(float64(lse[i]))), "lse %d", i)
					}
					requireClose(t, colsOf(bdq, d.LdQ, w), to64(colsOf(dq, d.LdQ, w)), 1e-5, "dq")
					requireClose(t, colsOf(bdk, d.LdK, w), to64(colsOf(dk, d.LdK, w)), 1e-5, "dk")
					requireClose(t, colsOf(bdv, d.LdV, w), to64(colsOf(dv, d.LdV, w)), 1e-5, "dv")

					bout, _, bdq, _, _ = blockwise(db, c, nb, q, k, v, dout)
					wantOut, att, _ := refAttnPos(d, to64(q), to64(k), to64(v), c.qpos, c.kpos)
					wq, _, _ := refAttnPosBackward(d, to64(dout), to64(q), to64(k), to64(v), att)
					requireClose(t, colsOf(bout, d.LdO, w), colsOf(wantOut, d.LdO, w), 1e-2, "out, unrounded q and k")
					requireClose(t, colsOf(bdq, d.LdQ, w), colsOf(wq, d.LdQ, w), 1e-2, "dq, unrounded q and k")
				})
			}
		}
	}
}
