package cpu

import "math"

// AttentionDelta writes, for every row of every head, the dot product of
// the output gradient and the final (merged) output that
// AttentionLSEBackward needs:
//
//	delta[b,h,t] = Σ_i dout[b,t,h,i] · out[b,t,h,i]
//
// with out and dout in the layout of AttnDims (Tq rows, stride LdO) and
// delta [B, NH, Tq]. Sums run in float64 in index order.
func AttentionDelta[F Float](d AttnDims, dout, out []F, delta []F) {
	d.checkSizes("AttentionDelta", size{"dout", len(dout), d.rowsNeed(d.B*d.Tq, d.LdO)},
		size{"out", len(out), d.rowsNeed(d.B*d.Tq, d.LdO)}, size{"delta", len(delta), d.B * d.NH * d.Tq})
	ParallelFor(d.B*d.Tq, max(1, elemGrain/max(1, d.NH*d.HS)), func(lo, hi int) {
		if isF32[F]() {
			attnDelta32(d, as32(dout), as32(out), as32(delta), lo, hi)
			return
		}
		attentionDeltaGo(d, dout, out, delta, lo, hi)
	})
}

// attentionDeltaGo is AttentionDelta's loop over rows [lo, hi) of the
// B*Tq rows, which fastpath.c repeats for float32 (attnDelta32) with the
// sums of eight neighbouring (row, head) pairs side by side.
func attentionDeltaGo[F Float](d AttnDims, dout, out []F, delta []F, lo, hi int) {
	for r := lo; r < hi; r++ {
		b, t := r/d.Tq, r%d.Tq
		for h := range d.NH {
			g := dout[r*d.LdO+h*d.HS : r*d.LdO+(h+1)*d.HS]
			o := out[r*d.LdO+h*d.HS : r*d.LdO+(h+1)*d.HS]
			var s float64
			for i, x := range g {
				s += float64(x) * float64(o[i])
			}
			delta[(b*d.NH+h)*d.Tq+t] = F(s)
		}
	}
}

// AttentionMerge folds the attention (outB, lseB) of queries over a key
// block into the attention (out, lse) of the same queries over other keys,
// in place, so that (out, lse) becomes the attention over both key sets:
//
//	m    = max(lse, lseB)
//	lse' = m + log(exp(lse - m) + exp(lseB - m))
//	out' = out exp(lse - lse') + outB exp(lseB - lse')
//
// Rows where both are -Inf (no visible key in either) keep lse = -Inf and
// get out = 0. out and outB have the layout of AttnDims (Tq rows, stride
// LdO), lse and lseB are [B, NH, Tq]. The weights are computed in float64.
func AttentionMerge[F Float](d AttnDims, out, lse, outB, lseB []F) {
	d.checkSizes("AttentionMerge", size{"out", len(out), d.rowsNeed(d.B*d.Tq, d.LdO)},
		size{"lse", len(lse), d.B * d.NH * d.Tq}, size{"outB", len(outB), d.rowsNeed(d.B*d.Tq, d.LdO)},
		size{"lseB", len(lseB), d.B * d.NH * d.Tq})
	ParallelFor(d.B*d.Tq, max(1, elemGrain/max(1, d.NH*d.HS)), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			b, t := r/d.Tq, r%d.Tq
			for h := range d.NH {
				o := out[r*d.LdO+h*d.HS : r*d.LdO+(h+1)*d.HS]
				oB := outB[r*d.LdO+h*d.HS : r*d.LdO+(h+1)*d.HS]
				li := (b*d.NH+h)*d.Tq + t
				la, lb := float64(lse[li]), float64(lseB[li])
				m := math.Max(la, lb)
				if math.IsInf(m, -1) {
					clear(o)
					continue
				}
				// One of the two terms is exp(0) = 1.
				l := m + math.Log1p(math.Exp(math.Min(la, lb)-m))
				wa, wb := F(math.Exp(la-l)), F(math.Exp(lb-l))
				for i, x := range oB {
					o[i] = o[i]*wa + x*wb
				}
				lse[li] = F(l)
			}
		}
	})
}
