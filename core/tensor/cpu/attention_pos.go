package cpu

import (
	"fmt"
	"math"
)

// Attention over positions. A query row and a key row each carry a global
// token position; key j is visible to query i iff kpos[j] <= qpos[i]. This is
// the causal mask of the whole sequence restricted to the rows a caller
// holds, so attention can be computed over any subset of queries and any
// block of keys: a contiguous chunk, the two chunks of a zigzag split, or a
// key block received from another rank.
//
// For one head, with s_ij = q_i·k_j / sqrt(HS) over the visible keys V(i):
//
//	lse_i = log Σ_{j∈V(i)} exp(s_ij)        (the row's log-sum-exp)
//	P_ij  = exp(s_ij - lse_i) for j ∈ V(i), 0 otherwise
//	out_i = Σ_j P_ij v_j
//
// A row with no visible key has out_i = 0 and lse_i = -Inf.
//
// The log-sum-exp makes partial results exact to combine. If (out_A, lse_A)
// is the attention over key set A and (out_B, lse_B) over a disjoint set B,
// the attention over A ∪ B is (AttentionMerge)
//
//	lse   = m + log(exp(lse_A - m) + exp(lse_B - m)),  m = max(lse_A, lse_B)
//	out   = out_A exp(lse_A - lse) + out_B exp(lse_B - lse)
//
// because exp(lse_A - lse) is the share of A in the row's total softmax
// mass. Merging block after block is the online softmax of ring attention.
//
// The backward of a softmax spread over several key blocks needs only the
// final lse and, per row, delta_i = dout_i·out_i (AttentionDelta): with P
// recomputed from q, k and the final lse, the softmax backward
// dS = P∘(dP - rowsum(P∘dP)) has rowsum(P∘dP) = Σ_j P_ij dout_i·v_j =
// dout_i·out_i = delta_i, a sum over all blocks that out already holds. So
// each block's contribution to dq, dk and dv is computed from that block
// alone (AttentionLSEBackward).
//
// Positions must be strictly ascending within qpos and within kpos. Then the
// visible keys of every row are a prefix of the key block that grows with the
// row, and rows [i0, i1) need only the keys visible to row i1-1: the products
// run in row blocks of attnBlock and skip the invisible part, as the
// whole-sequence kernel always did (attnRows's rows, attnBlock's keys for
// dk and dv).

// AttnDims gives the shapes and layouts of attention over positions: B
// batches, NH heads of HS elements; Tq query rows and Tk key rows per batch
// element; row strides (in elements) of q, k, v and out/dout. Row t of batch
// b of q starts at (b*Tq+t)*LdQ, head h at column h*HS; the same holds for k
// (Tk, LdK), v (Tk, LdV) and out (Tq, LdO). Gradients dq, dk and dv have the
// layouts of q, k and v.
//
// KVH is the number of key/value heads (grouped-query attention): query
// head h reads key/value head h/(NH/KVH), at column (h/(NH/KVH))*HS of k
// and v, so the NH/KVH query heads of a group share their keys and values
// without copies of them. 0 means NH (every head its own).
//
// HalfProducts makes every matrix product of the attention a
// half-precision product in that format (operands rounded to it as read,
// float32 accumulation: GemmRoundBF16, GemmRoundF16), as PyTorch's
// autocast does: the scores q k^T, the output P v, and the backward's dP =
// dout v^T, dq = dS k, dk = dS^T q and dv = P^T dout. Mixed precision sets
// it to the compute dtype, as for every other product. The softmax, the
// log-sum-exp, delta and dS = P∘(dP - delta) stay float32; P and dS are
// rounded only where a product reads them. NoHalf (the default) keeps
// every product in the buffers' type; float64 attention ignores it.
type AttnDims struct {
	B, NH, HS, Tq, Tk, LdQ, LdK, LdV, LdO, KVH int
	HalfProducts                               HalfFormat
}

// HalfFormat names the format of half-precision products: NoHalf, BF16
// or F16.
type HalfFormat uint8

const (
	NoHalf HalfFormat = iota // the products of the buffers' type
	BF16                     // bfloat16 operands, float32 accumulation
	F16                      // IEEE fp16 operands, float32 accumulation
)

// shape prints d's sizes and strides for error messages.
func (d AttnDims) shape() string {
	return fmt.Sprintf("{B:%d NH:%d HS:%d Tq:%d Tk:%d LdQ:%d LdK:%d LdV:%d LdO:%d KVH:%d}",
		d.B, d.NH, d.HS, d.Tq, d.Tk, d.LdQ, d.LdK, d.LdV, d.LdO, d.KVH)
}

// gemmFunc is the signature of the attention's matrix products (Gemm's).
type gemmFunc[F Float] func(ta, tb bool, m, n, k int, alpha F, a []F, lda int, b []F, ldb int, beta F, c []F, ldc int)

// productFor returns the matrix product every product of the attention
// runs, on the calling goroutine: gemmFor's, or under d.HalfProducts
// (float32 only) the half-precision product of that format.
func productFor[F Float](d AttnDims) gemmFunc[F] {
	if d.HalfProducts == NoHalf || !isF32[F]() {
		return gemmFor[F]()
	}
	f16 := d.HalfProducts == F16
	half := gemmFunc[float32](func(ta, tb bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
		gemmHalfSerial(f16, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
	})
	return any(half).(gemmFunc[F])
}

// keyProduct returns mul(m, n, alpha, a, lda, c, ldc), which sets C to
// alpha A X[:n]^T for X the rows rows of x (stride ld, HS columns), as
// gemm(false, true, ..., beta 0) does: the products of one head over its
// keys (the scores) or values (dout v^T), whose row blocks read growing
// prefixes of the same rows. Under HalfProducts (float32) X is rounded
// once for all of them (halfKeys), with the same result. release gives
// back what it holds.
func keyProduct[F Float](d AttnDims, gemm gemmFunc[F], x []F, ld, rows int) (mul func(m, n int, alpha F, a []F, lda int, c []F, ldc int), release func()) {
	if d.HalfProducts == NoHalf || !isF32[F]() {
		return func(m, n int, alpha F, a []F, lda int, c []F, ldc int) {
			gemm(false, true, m, n, d.HS, alpha, a, lda, x, ld, 0, c, ldc)
		}, func() {}
	}
	h := newHalfKeys(d.HalfProducts == F16, as32(x), ld, rows, d.HS)
	return func(m, n int, alpha F, a []F, lda int, c []F, ldc int) {
		h.mul(m, n, float32(alpha), as32(a), lda, as32(c), ldc)
	}, h.release
}

// kvHeads is KVH with its default applied.
func (d AttnDims) kvHeads() int {
	if d.KVH == 0 {
		return d.NH
	}
	return d.KVH
}

// rowsNeed is the number of elements a buffer of rows rows of stride ld
// holding NH*HS columns must have.
func (d AttnDims) rowsNeed(rows, ld int) int {
	if rows == 0 {
		return 0
	}
	return (rows-1)*ld + d.NH*d.HS
}

// kvRowsNeed is rowsNeed for key and value buffers (KVH*HS columns).
func (d AttnDims) kvRowsNeed(rows, ld int) int {
	if rows == 0 {
		return 0
	}
	return (rows-1)*ld + d.kvHeads()*d.HS
}

// checkSizes validates the dimensions and buffer sizes.
func (d AttnDims) checkSizes(op string, sizes ...size) {
	w, kw := d.NH*d.HS, d.kvHeads()*d.HS
	if d.B < 0 || d.NH < 1 || d.HS < 1 || d.Tq < 0 || d.Tk < 0 || d.KVH < 0 || d.NH%d.kvHeads() != 0 ||
		d.LdQ < w || d.LdK < kw || d.LdV < kw || d.LdO < w {
		panic(fmt.Sprintf("cpu.%s: bad dimensions %+v; need B, Tq, Tk >= 0, NH, HS >= 1, KVH dividing NH and row strides >= NH*HS (k, v: KVH*HS)", op, d.shape()))
	}
	for _, s := range sizes {
		if s.have < s.need {
			panic(fmt.Sprintf("cpu.%s: %s has %d elements, need %d for %s", op, s.name, s.have, s.need, d.shape()))
		}
	}
}

// check validates the dimensions, buffer sizes and positions, and returns
// vis: vis[i] is the number of keys visible to query i.
func (d AttnDims) check(op string, qpos, kpos []int, sizes ...size) []int64 {
	d.checkSizes(op, sizes...)
	checkPositions(op, "qpos", qpos, d.Tq)
	checkPositions(op, "kpos", kpos, d.Tk)
	vis := make([]int64, d.Tq)
	j := 0
	for i, p := range qpos {
		for j < len(kpos) && kpos[j] <= p {
			j++
		}
		vis[i] = int64(j)
	}
	return vis
}

func checkPositions(op, name string, pos []int, n int) {
	if len(pos) != n {
		panic(fmt.Sprintf("cpu.%s: %s has %d positions for %d rows", op, name, len(pos), n))
	}
	for i := 1; i < len(pos); i++ {
		if pos[i] <= pos[i-1] {
			panic(fmt.Sprintf("cpu.%s: %s is not strictly ascending: position %d at index %d follows %d (put the rows in position order)",
				op, name, pos[i], i, pos[i-1]))
		}
	}
}

// posHead locates one (batch, head) pair of attention over positions.
type posHead[F Float] struct {
	q, k, v, o []F // starts of this head's columns (strides LdQ, LdK, LdV, LdO)
	lse        []F // this head's Tq log-sum-exps, nil when not wanted
}

func posHeadAt[F Float](d AttnDims, bh int, q, k, v, o, lse []F) posHead[F] {
	b, h := bh/d.NH, bh%d.NH
	c, kc := h*d.HS, h/(d.NH/d.kvHeads())*d.HS
	hd := posHead[F]{q: q[b*d.Tq*d.LdQ+c:], o: o[b*d.Tq*d.LdO+c:]}
	if d.Tk > 0 { // an empty key block may come with empty buffers
		hd.k, hd.v = k[b*d.Tk*d.LdK+kc:], v[b*d.Tk*d.LdV+kc:]
	}
	if lse != nil {
		hd.lse = lse[bh*d.Tq : (bh+1)*d.Tq]
	}
	return hd
}

// colsRead is how many entries of row i of the score and probability
// buffers the backward reads: the keys of its row block (nk) for dq, and the
// key blocks of attnBlock columns that hold a visible key for dk and dv.
// Entries from vis[i] up to it must be zero.
func colsRead(vis, nk, Tk int) int {
	return max(nk, min(Tk, (vis+attnBlock-1)/attnBlock*attnBlock))
}

// AttentionPosForward computes causal multi-head attention of queries at
// positions qpos over keys at positions kpos (see the formulas above):
// out = P v, and per row lse (if lse is not nil) the log-sum-exp of the
// visible scores, [B, NH, Tq]. If att is not nil it receives P, [B, NH, Tq,
// Tk], zero on the invisible keys, for AttentionPosBackward. Heads run in
// parallel, each on one goroutine, so results do not depend on the thread
// count.
func AttentionPosForward[F Float](d AttnDims, q, k, v []F, qpos, kpos []int, out, att, lse []F) {
	sizes := []size{{"q", len(q), d.rowsNeed(d.B*d.Tq, d.LdQ)}, {"k", len(k), d.kvRowsNeed(d.B*d.Tk, d.LdK)},
		{"v", len(v), d.kvRowsNeed(d.B*d.Tk, d.LdV)}, {"out", len(out), d.rowsNeed(d.B*d.Tq, d.LdO)}}
	if att != nil {
		sizes = append(sizes, size{"att", len(att), d.B * d.NH * d.Tq * d.Tk})
	}
	if lse != nil {
		sizes = append(sizes, size{"lse", len(lse), d.B * d.NH * d.Tq})
	}
	vis := d.check("AttentionPosForward", qpos, kpos, sizes...)
	if d.B == 0 || d.Tq == 0 {
		return
	}
	hs, Tq, Tk := d.HS, d.Tq, d.Tk
	scale := F(1 / math.Sqrt(float64(hs)))
	gemm := productFor[F](d)
	rb := attnRows[F](d)
	if d.B*d.NH > 1 {
		defer serialBLAS()()
	}
	ParallelFor(d.B*d.NH, 1, func(lo, hi int) {
		var scratch *[]F
		if att == nil {
			scratch = getBuf[F](attnBlock * Tk)
			defer putBuf(scratch)
		}
		var mx, sum [attnBlock]F
		for bh := lo; bh < hi; bh++ {
			hd := posHeadAt(d, bh, q, k, v, out, lse)
			scores, release := keyProduct(d, gemm, hd.k, d.LdK, int(vis[Tq-1]))
			pv, releaseV := spanProduct(d, gemm, hd.v, d.LdV, int(vis[Tq-1]))
			for i0 := 0; i0 < Tq; i0 += rb {
				i1 := min(Tq, i0+rb)
				nk := int(vis[i1-1]) // keys visible to some row of the block
				if nk == 0 {
					for i := i0; i < i1; i++ {
						clear(hd.o[i*d.LdO : i*d.LdO+hs])
						if hd.lse != nil {
							hd.lse[i] = F(math.Inf(-1))
						}
					}
					if att != nil {
						clear(att[(bh*Tq+i0)*Tk : (bh*Tq+i1)*Tk])
					}
					continue
				}
				// p holds the block's rows, stride Tk: the stored
				// probabilities, or scratch when they are not kept.
				var p []F
				width := nk // zero the rest of the row only when it is stored
				if att != nil {
					p, width = att[(bh*Tq+i0)*Tk:(bh*Tq+i1)*Tk], Tk
				} else {
					p = (*scratch)[:(i1-i0)*Tk]
				}
				scores(i1-i0, nk, scale, hd.q[i0*d.LdQ:], d.LdQ, p, Tk)
				softmaxPrefix(p, Tk, width, vis[i0:i1], mx[:i1-i0], sum[:i1-i0])
				if hd.lse != nil {
					lseRows(hd.lse[i0:i1], mx[:i1-i0], sum[:i1-i0])
				}
				pv(false, i1-i0, 0, nk, 1, p, Tk, 0, hd.o[i0*d.LdO:], d.LdO)
			}
			release()
			releaseV()
		}
	})
}

// softmaxPrefix is softmaxPrefix32 for any Float: the float64 path uses
// math.Exp. A row's maximum is -Inf and its sum 0 when it has no entry.
func softmaxPrefix[F Float](p []F, ld, width int, lens []int64, maxs, sums []F) {
	if isF32[F]() {
		softmaxPrefix32(as32(p), ld, width, lens, as32(maxs), as32(sums))
		return
	}
	for r, n := range lens {
		row := p[r*ld : r*ld+width]
		if n > 0 {
			mx := row[0]
			for _, x := range row[1:n] {
				mx = max(mx, x)
			}
			s := expShift(row[:n], row[:n], mx)
			inv := 1 / s
			for i := range row[:n] {
				row[i] *= inv
			}
			maxs[r], sums[r] = mx, s
		} else {
			maxs[r], sums[r] = F(math.Inf(-1)), 0
		}
		clear(row[n:])
	}
}

// lseRows sets each row's log-sum-exp from its maximum and its sum of
// exp(x - max): lse = max + log(sum), -Inf for a row with no entry (max
// -Inf, sum 0). float32 rows take it in C (lseRows32), one call for a row
// block rather than a Go call of math.Log a row.
func lseRows[F Float](lse, maxs, sums []F) {
	if isF32[F]() {
		lseRows32(as32(lse), as32(maxs), as32(sums))
		return
	}
	lseRowsGo(lse, maxs, sums)
}

// lseRowsGo is lseRows's loop, which fastpath.c repeats for float32 with
// math.Log's arithmetic written out (go_log).
func lseRowsGo[F Float](lse, maxs, sums []F) {
	sums, maxs = sums[:len(lse)], maxs[:len(lse)]
	for r, s := range sums {
		lse[r] = maxs[r] + F(math.Log(float64(s)))
	}
}

// AttentionPosBackward accumulates into dq, dk and dv the gradient of
// AttentionPosForward's out given dout (layout of out) and the stored
// probabilities att, for a forward whose keys were the whole softmax. Per
// head, with s = 1/sqrt(HS):
//
//	dP = dout v^T;  dv += P^T dout
//	dS = P∘(dP - rowsum(P∘dP))   (softmax backward, visible keys only)
//	dq += s dS k;   dk += s dS^T q
//
// Heads run in parallel and write disjoint columns (the heads of a
// key/value group, which share dk and dv, in turn), so the result does not
// depend on the thread count.
func AttentionPosBackward[F Float](d AttnDims, dout, q, k, v, att []F, qpos, kpos []int, dq, dk, dv []F) {
	vis := d.check("AttentionPosBackward", qpos, kpos, backwardSizes(d, dout, q, k, v, dq, dk, dv,
		size{"att", len(att), d.B * d.NH * d.Tq * d.Tk})...)
	attentionBackward(d, vis, dout, q, k, v, att, nil, nil, dq, dk, dv, false)
}

// AttentionLSEBackward accumulates into dq, dk and dv the contribution of
// one key block (k, v at positions kpos) to the gradient of an attention
// whose softmax spans several key blocks, given dout, the final merged lse
// ([B, NH, Tq]) and delta from AttentionDelta. Per head, with s =
// 1/sqrt(HS) and scores restricted to the visible keys:
//
//	P = exp(s q k^T - lse);  dP = dout v^T
//	dS = P∘(dP - delta)
//	dq += s dS k;  dk += s dS^T q;  dv += P^T dout
//
// Rows with lse = -Inf (no visible key anywhere) contribute nothing. Summed
// over all key blocks this is the gradient of the whole attention.
func AttentionLSEBackward[F Float](d AttnDims, dout, q, k, v, delta, lse []F, qpos, kpos []int, dq, dk, dv []F) {
	rows := size{"delta", len(delta), d.B * d.NH * d.Tq}
	vis := d.check("AttentionLSEBackward", qpos, kpos, backwardSizes(d, dout, q, k, v, dq, dk, dv,
		rows, size{"lse", len(lse), d.B * d.NH * d.Tq})...)
	attentionBackward(d, vis, dout, q, k, v, nil, delta, lse, dq, dk, dv, false)
}

// AttentionLSEGrad is AttentionLSEBackward that sets dq, dk and dv (each
// head's columns of every row) to the key block's contribution instead of
// adding it: it never reads them, so the gradient of an attention over a
// single key block needs no zero-filled buffers. The result is bitwise
// AttentionLSEBackward's into zeros: each product writes alpha·A·B where
// it would have added it to 0, and rows no key reaches are cleared.
func AttentionLSEGrad[F Float](d AttnDims, dout, q, k, v, delta, lse []F, qpos, kpos []int, dq, dk, dv []F) {
	rows := size{"delta", len(delta), d.B * d.NH * d.Tq}
	vis := d.check("AttentionLSEGrad", qpos, kpos, backwardSizes(d, dout, q, k, v, dq, dk, dv,
		rows, size{"lse", len(lse), d.B * d.NH * d.Tq})...)
	attentionBackward(d, vis, dout, q, k, v, nil, delta, lse, dq, dk, dv, true)
}

func backwardSizes[F Float](d AttnDims, dout, q, k, v, dq, dk, dv []F, more ...size) []size {
	return append([]size{
		{"dout", len(dout), d.rowsNeed(d.B*d.Tq, d.LdO)},
		{"q", len(q), d.rowsNeed(d.B*d.Tq, d.LdQ)}, {"k", len(k), d.kvRowsNeed(d.B*d.Tk, d.LdK)},
		{"v", len(v), d.kvRowsNeed(d.B*d.Tk, d.LdV)},
		{"dq", len(dq), d.rowsNeed(d.B*d.Tq, d.LdQ)}, {"dk", len(dk), d.kvRowsNeed(d.B*d.Tk, d.LdK)},
		{"dv", len(dv), d.kvRowsNeed(d.B*d.Tk, d.LdV)},
	}, more...)
}

// attentionBackward is the backward of both: with att it reads the stored
// probabilities and takes rowsum(P∘dP) row by row; without, it recomputes P
// from the final lse and uses delta. With set it writes dq, dk and dv
// rather than adding to them (AttentionLSEGrad): the first product into
// each block of rows overwrites it (beta 0), and a block no product
// reaches is cleared.
func attentionBackward[F Float](d AttnDims, vis []int64, dout, q, k, v, att, delta, lse []F, dq, dk, dv []F, set bool) {
	if d.B == 0 || d.Tq == 0 || d.Tk == 0 {
		if set {
			clearRows(dq, d.B*d.Tq, d.LdQ, d.NH*d.HS)
			clearRows(dk, d.B*d.Tk, d.LdK, d.kvHeads()*d.HS)
			clearRows(dv, d.B*d.Tk, d.LdV, d.kvHeads()*d.HS)
		}
		return
	}
	hs, Tq, Tk := d.HS, d.Tq, d.Tk
	scale := F(1 / math.Sqrt(float64(hs)))
	gemm := productFor[F](d)
	rb := attnRows[F](d)
	if d.B*d.NH > 1 {
		defer serialBLAS()()
	}
	// The query heads of a key/value group add into the same dk and dv
	// columns: a group's heads run one after another on one goroutine.
	group := d.NH / d.kvHeads()
	ParallelFor(d.B*d.NH/group, 1, func(glo, ghi int) {
		lo, hi := glo*group, ghi*group
		dsBuf := getBuf[F](Tq * Tk)
		defer putBuf(dsBuf)
		ds := *dsBuf
		var pBuf *[]F
		if att == nil {
			pBuf = getBuf[F](Tq * Tk)
			defer putBuf(pBuf)
		}
		for bh := lo; bh < hi; bh++ {
			hd := posHeadAt(d, bh, q, k, v, dout, lse)
			g := posHeadAt(d, bh, dq, dk, dv, dout, nil)
			var p, dl []F // this head's probabilities (stride Tk) and deltas
			if att != nil {
				p = att[bh*Tq*Tk : (bh+1)*Tq*Tk]
			} else {
				p, dl = *pBuf, delta[bh*Tq:(bh+1)*Tq]
			}
			// dq's rows are this head's alone; dk and dv are the group's,
			// set by its first head and added to by the others.
			betaQ, betaKV := F(1), F(1)
			if set {
				betaQ = 0
				if bh%group == 0 {
					betaKV = 0
				}
			}
			// Row blocks of P, dP and dS: rows [i0,i1) see keys [0,nk).
			var scores func(m, n int, alpha F, a []F, lda int, c []F, ldc int)
			releaseK := func() {}
			if att == nil { // the scores are recomputed
				scores, releaseK = keyProduct(d, gemm, hd.k, d.LdK, int(vis[Tq-1]))
			}
			dP, releaseV := keyProduct(d, gemm, hd.v, d.LdV, int(vis[Tq-1]))
			dsk, releaseDK := spanProduct(d, gemm, hd.k, d.LdK, int(vis[Tq-1]))
			for i0 := 0; i0 < Tq; i0 += rb {
				i1 := min(Tq, i0+rb)
				nk := int(vis[i1-1])
				if nk == 0 {
					if set { // no product writes these rows of dq
						clearRows(g.q[i0*d.LdQ:], i1-i0, d.LdQ, hs)
					}
					continue // no row of the block sees a key; none is read below
				}
				// Row i's entries the products read: its visible keys
				// (lens), then zeros up to ends.
				var lens, ends [attnBlock]int64
				for i := i0; i < i1; i++ {
					lens[i-i0], ends[i-i0] = vis[i], int64(colsRead(int(vis[i]), nk, Tk))
				}
				if att == nil {
					scores(i1-i0, nk, scale, hd.q[i0*d.LdQ:], d.LdQ, p[i0*Tk:], Tk)
					exps := lens // the visible entries that get exp(s - lse)
					for i := i0; i < i1; i++ {
						if math.IsInf(float64(hd.lse[i]), -1) {
							exps[i-i0] = 0 // no key visible anywhere: the row contributes nothing
						}
					}
					expMinusRows(p[i0*Tk:], Tk, exps[:i1-i0], ends[:i1-i0], hd.lse[i0:i1])
				}
				dP(i1-i0, nk, 1, hd.o[i0*d.LdO:], d.LdO, ds[i0*Tk:], Tk)
				if att != nil {
					// invisible scores get no gradient
					softmaxBackwardRows(p[i0*Tk:], ds[i0*Tk:], Tk, lens[:i1-i0], ends[:i1-i0])
				} else {
					lseBackwardRows(p[i0*Tk:], ds[i0*Tk:], Tk, lens[:i1-i0], ends[:i1-i0], dl[i0:i1])
				}
				dsk(false, i1-i0, 0, nk, scale, ds[i0*Tk:], Tk, betaQ, g.q[i0*d.LdQ:], d.LdQ)
			}
			releaseK()
			releaseV()
			releaseDK()
			// Column blocks for dk and dv: key rows [j0,j1) get contributions
			// from the query rows that see key j0, rows [first,Tq).
			first := 0
			dsq, releaseQ := spanProduct(d, gemm, hd.q, d.LdQ, Tq)
			pdo, releaseO := spanProduct(d, gemm, hd.o, d.LdO, Tq)
			for j0 := 0; j0 < Tk; j0 += attnBlock {
				j1 := min(Tk, j0+attnBlock)
				for first < Tq && int(vis[first]) <= j0 {
					first++
				}
				if first == Tq {
					if betaKV == 0 { // no query sees keys j0 on: nothing else writes them
						clearRows(g.k[j0*d.LdK:], Tk-j0, d.LdK, hs)
						clearRows(g.v[j0*d.LdV:], Tk-j0, d.LdV, hs)
					}
					break
				}
				m := Tq - first
				dsq(true, j1-j0, first, m, scale, ds[first*Tk+j0:], Tk, betaKV, g.k[j0*d.LdK:], d.LdK)
				pdo(true, j1-j0, first, m, 1, p[first*Tk+j0:], Tk, betaKV, g.v[j0*d.LdV:], d.LdV)
			}
			releaseQ()
			releaseO()
		}
	})
}

// clearRows zeroes the first cols entries of rows rows of x (stride ld).
func clearRows[F Float](x []F, rows, ld, cols int) {
	for r := range rows {
		clear(x[r*ld : r*ld+cols])
	}
}

// expMinus replaces each score x of row with exp(x - lse); in float32 with
// expCore, flushing results below the smallest normal float32 to zero as the
// forward softmax does.
func expMinus[F Float](row []F, lse F) {
	if isF32[F]() {
		expMinus32(as32(row), float32(lse))
		return
	}
	for i, x := range row {
		row[i] = F(math.Exp(float64(x - lse)))
	}
}

// expMinusRows applies expMinus to the first lens[r] entries of each row r
// of p (stride ld) with lse[r] and zeroes its entries from there up to
// ends[r]: one call for a row block, in C for float32.
func expMinusRows[F Float](p []F, ld int, lens, ends []int64, lse []F) {
	if isF32[F]() {
		expMinusRows32(as32(p), ld, lens, ends, as32(lse))
		return
	}
	expMinusRowsGo(p, ld, lens, ends, lse)
}

// expMinusRowsGo is expMinusRows's loop, which fastpath.c repeats.
func expMinusRowsGo[F Float](p []F, ld int, lens, ends []int64, lse []F) {
	for r, n := range lens {
		row := p[r*ld : r*ld+int(ends[r])]
		expMinus(row[:n], lse[r])
		clear(row[n:])
	}
}

// expMinus32Go is expMinus on float32, the loop fastpath.c repeats.
func expMinus32Go(r []float32, l float32) {
	for i, x := range r {
		var e float32
		if y := x - l; y >= expLo {
			e = expCore(min(y, expHi))
		}
		r[i] = e
	}
}

// lseBackward turns dp (the gradient w.r.t. the probabilities p of one row)
// into the gradient w.r.t. the scores, p∘(dp - delta), where delta is the
// row's sum of p∘dp over all key blocks.
func lseBackward[F Float](p, dp []F, delta F) {
	if isF32[F]() {
		lseBackward32(as32(p), as32(dp), float32(delta))
		return
	}
	lseBackwardGo(p, dp, delta)
}

// lseBackwardRows applies lseBackward to the first lens[r] entries of each
// row r of p and dp (stride ld) with delta[r] and zeroes dp's entries
// from there up to ends[r] (invisible scores get no gradient): one call
// for a row block, in C for float32.
func lseBackwardRows[F Float](p, dp []F, ld int, lens, ends []int64, delta []F) {
	if isF32[F]() {
		lseBackwardRows32(as32(p), as32(dp), ld, lens, ends, as32(delta))
		return
	}
	lseBackwardRowsGo(p, dp, ld, lens, ends, delta)
}

// lseBackwardRowsGo is lseBackwardRows's loop, which fastpath.c repeats.
func lseBackwardRowsGo[F Float](p, dp []F, ld int, lens, ends []int64, delta []F) {
	for r, n := range lens {
		lseBackward(p[r*ld:r*ld+int(n)], dp[r*ld:r*ld+int(n)], delta[r])
		clear(dp[r*ld+int(n) : r*ld+int(ends[r])])
	}
}

// lseBackwardGo is lseBackward's loop, which fastpath.c repeats for
// float32 (lseBackward32).
func lseBackwardGo[F Float](p, dp []F, delta F) {
	dp = dp[:len(p)]
	for i, v := range p {
		dp[i] = v * (dp[i] - delta)
	}
}
