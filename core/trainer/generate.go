package trainer

import (
	"math"
	"sort"

	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// Generate extends prompt by n tokens sampled from the model: softmax of
// the last position's logits divided by temperature, restricted to the topK
// most likely tokens (0 = all), drawn from a generator seeded by seed.
// Temperature 0 picks the most likely token. Only the last block_size
// tokens are fed to the model.
func Generate(m *nn.GPT, prompt []int32, n int, temperature float64, topK int, seed int64) ([]int32, error) {
	out := append([]int32(nil), prompt...)
	if len(out) == 0 {
		out = append(out, '\n')
	}
	r := nn.NewRand(seed, "sample")
	V := m.Config.VocabSize
	for i := 0; i < n; i++ {
		ctx := out
		if len(ctx) > m.Config.BlockSize {
			ctx = ctx[len(ctx)-m.Config.BlockSize:]
		}
		idx := tensor.FromI32(append([]int32(nil), ctx...), 1, len(ctx))
		logits, err := m.Logits(idx, nn.Pass{Info: tensor.PassInfo{Last: true}})
		if err != nil {
			return nil, err
		}
		row := make([]float64, V)
		base := (len(ctx) - 1) * V
		for v := 0; v < V; v++ {
			row[v] = logits.At(base + v)
		}
		tensor.FreeGraph(logits)
		logits.Release()
		out = append(out, int32(pick(row, temperature, topK, r)))
	}
	return out, nil
}

func pick(logits []float64, temperature float64, topK int, r *nn.Rand) int {
	order := make([]int, len(logits))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return logits[order[a]] > logits[order[b]] })
	if temperature <= 0 {
		return order[0]
	}
	if topK > 0 && topK < len(order) {
		order = order[:topK]
	}
	maxL := logits[order[0]]
	w := make([]float64, len(order))
	var sum float64
	for i, v := range order {
		w[i] = math.Exp((logits[v] - maxL) / temperature)
		sum += w[i]
	}
	u := r.Float64() * sum
	for i, v := range order {
		u -= w[i]
		if u < 0 {
			return v
		}
	}
	return order[len(order)-1]
}
