package pp

import (
	"fmt"
	"math"

	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/place"
)

// Cost model of the balanced split, in forward FLOPs per token (the
// backward is twice that everywhere, so it cancels): a block does 24·C²
// in its four matrix products (c_attn 6C², c_proj 2C², c_fc 8C², mlp
// c_proj 8C²) and 4·T·C in attention (scores and weighted values); the
// head adds 2·V·C for the logits; the embedding is a lookup and counts
// nothing.
//
// In general a block's matrix products cost twice its matrices' sizes:
// a Llama's q|k|v C·(H+2K)·hs, o_proj C·H·hs and three C·I for gate, up
// and down.
func blockCost(c nn.GPTConfig) float64 {
	return BlockProductFLOPs(c) + 4*float64(c.BlockSize)*float64(c.NEmbd)
}

// BlockProductFLOPs is the part of BlockFLOPs in the block's matrix
// products (its linear layers), the rest being attention's.
func BlockProductFLOPs(c nn.GPTConfig) float64 {
	C, hs := float64(c.NEmbd), float64(c.HeadSize())
	q, kv := float64(c.NHead)*hs, float64(c.KVHeads())*hs
	mlp := 2.0 // c_fc, mlp.c_proj
	if c.Llama != nil {
		mlp = 3 // gate, up, down
	}
	return 2 * (C*(q+2*kv) + q*C + mlp*C*float64(c.FFN()))
}

// BlockProductWidths is, per token, the widths of the inputs and outputs
// of one block's matrix products, summed: those of width C (whole on
// every rank of a tensor-parallel group) and those split over it (the
// column layers' outputs, the row layers' inputs). A product's weight
// gradient reads its input and its output's gradient, these widths.
func BlockProductWidths(c nn.GPTConfig) (whole, split float64) {
	C, hs, I := float64(c.NEmbd), float64(c.HeadSize()), float64(c.FFN())
	q, kv := float64(c.NHead)*hs, float64(c.KVHeads())*hs
	if c.Llama != nil {
		// q|k|v and o_proj; gate, up and down.
		return 2*C + 3*C, (q + 2*kv) + q + 3*I
	}
	// c_attn and attn.c_proj; c_fc and mlp.c_proj.
	return 2*C + 2*C, (q + 2*kv) + q + 2*I
}

func headCost(c nn.GPTConfig) float64 { return 2 * float64(c.VocabSize) * float64(c.NEmbd) }

// BlockFLOPs and HeadFLOPs are the forward FLOPs per token of one block
// and of the head, the cost model of Balance; the planner's step time
// starts from the same counts.
func BlockFLOPs(c nn.GPTConfig) float64 { return blockCost(c) }

// HeadFLOPs: see BlockFLOPs.
func HeadFLOPs(c nn.GPTConfig) float64 { return headCost(c) }

// Balance splits the model's blocks into k contiguous chunks, each at
// least one block, minimising the most expensive chunk (the last one
// carries the head). It returns the block count of each chunk.
func Balance(c nn.GPTConfig, k int) ([]int, error) {
	n := c.NLayer
	if k < 1 || k > n {
		return nil, fmt.Errorf("pp: %d model chunks cannot split %d blocks: every chunk needs at least one", k, n)
	}
	bc, hc := blockCost(c), headCost(c)
	// best[j][i]: the least max cost of the first i blocks in j chunks.
	inf := math.Inf(1)
	best := make([][]float64, k+1)
	cut := make([][]int, k+1)
	for j := range best {
		best[j] = make([]float64, n+1)
		cut[j] = make([]int, n+1)
		for i := range best[j] {
			best[j][i] = inf
		}
	}
	best[0][0] = 0
	for j := 1; j <= k; j++ {
		for i := j; i <= n; i++ {
			// The j-th chunk holds blocks [s, i). Earlier cuts win ties,
			// so the extra block of an uneven split goes to earlier chunks.
			for s := i - 1; s >= j-1; s-- {
				cost := float64(i-s) * bc
				if j == k && i == n {
					cost += hc
				}
				if v := math.Max(best[j-1][s], cost); v < best[j][i] {
					best[j][i], cut[j][i] = v, s
				}
			}
		}
	}
	out := make([]int, k)
	for j, i := k, n; j >= 1; j-- {
		s := cut[j][i]
		out[j-1] = i - s
		i = s
	}
	return out, nil
}

// keepStage returns the part of the whole model m that pipeline rank r of
// p holds, chunk c of the split (block counts per chunk, chunk c on rank
// c mod p): its blocks, the embedding on the first rank, the final
// LayerNorm and head on the last. The stage takes m's modules themselves,
// so layers a model rewriter installed (tensor parallel) stay. On a last
// stage without the embedding the head registers the tied table as its
// own parameter: the copy the embedding group keeps equal to the first
// stage's. Each kept parameter's placement along the pipeline axis is
// Held by this rank (wte: by the first and the last rank).
func keepStage(m *nn.GPT, split []int, p, r int) (*nn.GPT, error) {
	blocks := m.Blocks()
	if !m.Whole() {
		return nil, fmt.Errorf("pp: the model is already part of the GPT; a pipeline splits the whole model")
	}
	stage := &nn.GPT{Config: m.Config}
	lo := 0
	for c, n := range split {
		if c%p == r {
			stage.Chunks = append(stage.Chunks, &nn.Chunk{Blocks: blocks[lo : lo+n]})
		}
		lo += n
	}
	first, last := r == 0, r == (len(split)-1)%p
	if first {
		stage.Embed = m.Embed
	}
	tied := m.Config.TiedTable() // "": an untied Llama's head holds its own lm_head
	if last {
		stage.Head = m.Head
		if !first && tied != "" {
			wte := m.Head.Wte
			spec := wte.Spec
			m.Head.AddParam(tied, wte)
			wte.Spec = spec // keep a rewriter's placement of the table
		}
	}
	for _, q := range stage.Params() {
		held := []int{r}
		if q.Name == tied {
			held = []int{0, p - 1}
		}
		q.Spec = q.Spec.Clone()
		q.Spec.Along[place.PP] = place.Placement{Kind: place.Held, Ranks: held}
	}
	return stage, nil
}
