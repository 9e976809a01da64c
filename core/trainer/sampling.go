package trainer

import (
	"fmt"
	"math"
)

// CheckSampling refuses generation settings that would do nothing useful
// or nonsense: no tokens, a temperature that is negative or not a number
// (softmax of NaN logits picks garbage), a negative top-k. Every binding
// calls it before any work, and names the setting in its own terms.
func CheckSampling(tokens int, temperature float64, topK int) error {
	if tokens < 1 {
		return fmt.Errorf("tokens=%d must be >= 1", tokens)
	}
	if math.IsNaN(temperature) || math.IsInf(temperature, 0) || temperature < 0 {
		return fmt.Errorf("temperature=%v must be a finite number >= 0 (0 = greedy)", temperature)
	}
	if topK < 0 {
		return fmt.Errorf("top_k=%d must be >= 0 (0 = all tokens)", topK)
	}
	return nil
}
