package zero

import "github.com/tinyacc/tinyacc/core/nn"

// StepBytes is what one rank of a ZeRO group of n sends over the group in
// one optimizer step of accum micro-batches, counted as the bench counts
// (docs/formulas.md: (n-1)/n of the whole buffer for an all-gather or a
// reduce-scatter), for the padded units of c (P elements in all): g bytes
// per reduced gradient element (4; 2 under ddp.reduce_dtype=bf16) and p
// per gathered parameter element (4 in float32; 2 under mixed precision,
// whose gathers carry the 2-byte copies, mixed.go):
//
//	stage 1  (n-1)/n · (g + p)·P              one reduce-scatter of the gradients and one
//	                                          all-gather of the parameters per step
//	stage 2  (n-1)/n · (accum·g + p)·P        the reduce-scatter every micro-batch
//	stage 3  accum · (n-1)/n · (g·P + p·(P + E + B))
//	                                          every micro-batch: every unit gathered for the
//	                                          forward, the embed unit E again for the tied
//	                                          head, the blocks B again for the backward
//
// The loss's mean and the gradient norm are the caller's.
func StepBytes(c nn.GPTConfig, stage, accum, n, g, p int) float64 {
	if n < 2 {
		return 0
	}
	numels, hasEmbed, _ := unitNumels(c.ParamShapes(), false)
	var P, embed, blocks float64
	for i, u := range numels {
		size := float64((u.numel + n - 1) / n * n)
		P += size
		if i > 0 && i < len(numels)-1 {
			blocks += size
		}
	}
	if hasEmbed && c.TiedTable() != "" {
		embed = float64((numels[0].numel + n - 1) / n * n)
	}
	f := float64(n-1) / float64(n)
	G, E, A := float64(g), float64(p), float64(accum)
	switch stage {
	case 1:
		return f * (G + E) * P
	case 2:
		return f * (A*G + E) * P
	}
	return A * f * (G*P + E*(P+embed+blocks))
}
