package trainer

import (
	"slices"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/nn"
)

// RecomputeOf is the block recomputation recompute.granularity and
// recompute.modules ask for.
func RecomputeOf(cfg config.Config) nn.Recompute {
	r := cfg.Recompute
	switch r.Granularity {
	case "full":
		return nn.Recompute{Full: true}
	case "selective":
		return nn.Recompute{Norm: slices.Contains(r.Modules, "norm"), MlpAct: slices.Contains(r.Modules, "mlp_act"),
			AttnCore: slices.Contains(r.Modules, "attn_core")}
	}
	return nn.Recompute{}
}

// RecomputedBlocks is how many blocks of a stage of L blocks run their
// forward again under recompute.granularity=full (recompute.blocks, 0 =
// all), 0 for the other granularities.
func RecomputedBlocks(cfg config.Config, L int) int {
	if cfg.Recompute.Granularity != "full" {
		return 0
	}
	if n := cfg.Recompute.Blocks; n > 0 {
		return min(n, L)
	}
	return L
}

// RecomputeSavedBytes is what recompute.* takes off ActivationBytes's peak
// for one process (fp32, batch B, context T, width C, H heads, L blocks;
// docs/formulas.md). The peak stays in the backward of the first block.
//
//   - full, k blocks recomputed: the block being recomputed (the first,
//     at the peak) holds a block's terms, A = 36·B·T·C + B·H·T (GPT-2),
//     and gives them back when its backward ends; each of the other k-1
//     holds only B·T·C, the output it passes on (its input's gradient is
//     the residual stream's gradient buffer, passed through from block
//     to block): (k-1)·(A - B·T·C) saved.
//   - selective: the dropped outputs, B·T·C per LayerNorm (norm: 2),
//     4·B·T·C for GELU's (mlp_act), B·T·C for the attention core's
//     (attn_core), are formed again for their block's backward and given
//     back after it, so every block saves them but the first, which
//     still holds ln_1's output when the peak is reached: L·D less
//     B·T·C under norm.
func RecomputeSavedBytes(cfg config.Config) int64 {
	m := GPTConfig(cfg)
	b, t, c, h, l := int64(cfg.Train.BatchSize), int64(m.BlockSize), int64(m.NEmbd), int64(m.NHead), int64(m.NLayer)
	btc := b * t * c
	switch cfg.Recompute.Granularity {
	case "full":
		k := int64(RecomputedBlocks(cfg, m.NLayer))
		whole, split := m.ActWidths() // GPT-2: 6·C and 12·C
		a := 2*(whole+split)*b*t + b*h*t
		return 4 * (k - 1) * (a - btc)
	case "selective":
		r := RecomputeOf(cfg)
		var d, first int64
		if r.Norm {
			d += 2 * btc
			first = btc
		}
		if r.MlpAct {
			d += 4 * btc
		}
		if r.AttnCore {
			d += btc
		}
		return 4 * (l*d - first)
	}
	return 0
}

// RecomputeFLOPsPerToken is the compute full recomputation adds to a
// token's training cost: one more forward of each recomputed block, 2·12·C²
// for its matrix products and 2·C·T for its attention (per token, as
// nn.GPTConfig.FLOPsPerToken counts). Selective recomputation repeats no
// matrix product.
func RecomputeFLOPsPerToken(cfg config.Config) float64 {
	m := GPTConfig(cfg)
	k, c, t := float64(RecomputedBlocks(cfg, m.NLayer)), float64(m.NEmbd), float64(m.BlockSize)
	return k * (24*c*c + 2*c*t)
}
