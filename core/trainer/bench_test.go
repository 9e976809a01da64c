package trainer

import (
	"testing"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/nn"
)

// BenchmarkStep times one training step of the `tinyacc bench step` GPT
// (n_layer 4, n_head 4, n_embd 256, context 256, batch 8).
func BenchmarkStep(b *testing.B) {
	cfg := config.Defaults()
	cfg.Model.NLayer, cfg.Model.NHead, cfg.Model.NEmbd, cfg.Model.BlockSize = 4, 4, 256, 256
	cfg.Train.BatchSize, cfg.Train.Steps = 8, b.N+1
	cfg.Data.Order = "random"
	r := nn.NewRand(1, "bench")
	tokens := make([]int32, 1<<18)
	for i := range tokens {
		tokens[i] = int32(r.Uint64() % 256)
	}
	tr, err := New(cfg, Options{Train: tokens})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := tr.Step(0); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := tr.Step(i + 1); err != nil {
			b.Fatal(err)
		}
	}
}
