package ptest

import (
	"fmt"
	"testing"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// SingleSummed is Single whose step sums its micro-batches' gradients as
// data parallel's all-reduce sums the ranks': each micro-batch's
// gradient is formed whole on its own (from zero), and the step's is
// g = g0; g += g1; ... in micro-batch order, where the trainer's own
// accumulation adds micro-batch a's contributions one by one into the
// gradient of the ones before it (an embedding row's scatter-adds, the
// tied head's product with beta 1), another order of the same float32
// additions. Run with train.grad_accum = dp and train.batch_size = the
// per-rank batch, micro-batch a is rank a's share of the global batch,
// scaled by 1/dp in backward where data parallel divides the sum by dp
// (both exact: dp is a power of two). Where the all-reduce also folds in
// rank order (any sum of two terms, x+y == y+x; the direct exchange of
// buffers up to 32 KiB and the shared-memory fold at any dp), the two
// runs add the same float32 numbers in the same order.
func SingleSummed(t testing.TB, cfg config.Config) Result {
	return single(t, cfg, &microSum{})
}

// microSum is the plugin of SingleSummed.
type microSum struct {
	// parts holds each parameter's gradient of every micro-batch of
	// the step so far, in micro-batch order.
	parts map[*tensor.Tensor][][]float32
}

func (m *microSum) Name() string { return "micro-batch sum" }

// PostGrad implements trainer.PostGrader: it keeps the micro-batch's
// gradients and zeroes them, so the next micro-batch's start from zero.
func (m *microSum) PostGrad(t *trainer.Trainer, info tensor.PassInfo) error {
	if info.Micro == 0 {
		m.parts = map[*tensor.Tensor][][]float32{}
	}
	for _, p := range t.Model.Params() {
		if p.Grad == nil {
			continue
		}
		if p.Grad.DType() != tensor.Float32 {
			return fmt.Errorf("ptest: micro-batch sum of %s gradient %s: float32 only", p.Grad.DType(), p.Name)
		}
		for len(m.parts[p]) < info.Micro {
			m.parts[p] = append(m.parts[p], make([]float32, p.Grad.Numel())) // no gradient reached p then
		}
		m.parts[p] = append(m.parts[p], append([]float32(nil), p.Grad.F32()...))
		p.Grad.Zero()
	}
	return nil
}

// PreStep implements trainer.PreStepper: each gradient becomes the sum of
// its micro-batches' in order.
func (m *microSum) PreStep(t *trainer.Trainer) error {
	for p, parts := range m.parts {
		g := p.Grad.F32()
		copy(g, parts[0])
		for _, part := range parts[1:] {
			for i := range g {
				g[i] += part[i]
			}
		}
	}
	m.parts = nil
	return nil
}
