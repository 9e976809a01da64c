package optim

import (
	"fmt"
	"math"
)

// Schedule gives the learning rate of each step (0-based).
type Schedule struct {
	Kind   string // "constant" or "cosine"
	LR     float64
	MinLR  float64
	Warmup int // linear warm-up steps (cosine only)
	Steps  int // total steps
}

// At returns the learning rate of step s. Cosine: linear warm-up from
// LR/Warmup to LR over Warmup steps, then cosine decay from LR to MinLR at
// the last step.
func (sc Schedule) At(s int) float64 {
	switch sc.Kind {
	case "constant", "":
		return sc.LR
	case "cosine":
		if s < sc.Warmup {
			return sc.LR * float64(s+1) / float64(sc.Warmup)
		}
		span := sc.Steps - sc.Warmup - 1
		if span <= 0 {
			return sc.LR
		}
		r := math.Min(1, float64(s-sc.Warmup)/float64(span))
		return sc.MinLR + 0.5*(1+math.Cos(math.Pi*r))*(sc.LR-sc.MinLR)
	}
	panic(fmt.Sprintf("optim: unknown schedule %q", sc.Kind))
}
