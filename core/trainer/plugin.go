package trainer

import "github.com/tinyacc/tinyacc/core/tensor"

// Plugin is a parallelism strategy (or any extension) attached to the loop.
// It implements only the hook interfaces below that it needs; the trainer
// finds them with type assertions.
type Plugin interface {
	Name() string
}

// Preparer runs once before training. It may rewrite the model (tensor
// parallel swaps layers, a pipeline keeps its stage), wrap the optimizer
// (ZeRO shards it) or change which data this rank reads (SetDataRank).
type Preparer interface {
	Prepare(t *Trainer) error
}

// PreForwarder runs before each micro-batch's forward.
type PreForwarder interface {
	PreForward(t *Trainer, info tensor.PassInfo) error
}

// GradReadier is told the moment a parameter's gradient for the current
// micro-batch is final, during backward, in the same order on every rank.
// Data parallel starts bucket all-reduces from here. An error is kept and
// returned by the step once backward is done.
type GradReadier interface {
	GradReady(t *Trainer, p *tensor.Tensor, info tensor.PassInfo) error
}

// PostGrader runs after each micro-batch's backward.
type PostGrader interface {
	PostGrad(t *Trainer, info tensor.PassInfo) error
}

// PreStepper runs after the last micro-batch, before clipping and the
// optimizer step (data parallel waits for its buckets here).
type PreStepper interface {
	PreStep(t *Trainer) error
}

// PostStepper runs after the optimizer step (ZeRO all-gathers updated
// parameters here) and sees the step's metrics.
type PostStepper interface {
	PostStep(t *Trainer, m *StepMetrics) error
}

// StepOwner runs the forward and backward passes of a whole step itself
// (a pipeline schedule) and returns the step's mean loss over the global
// batch. At most one plugin may own the step.
type StepOwner interface {
	RunStep(t *Trainer, step int) (loss float64, err error)
}

// GradNormer computes the global sum of squared gradients when gradients
// are sharded or partial across ranks.
type GradNormer interface {
	GradSumSquares(t *Trainer) (float64, error)
}

// LossReducer turns this rank's mean loss into the mean over the global
// batch (an average over data-parallel ranks).
type LossReducer interface {
	ReduceLoss(t *Trainer, loss float64) (float64, error)
}

// Finisher runs once after the last step (e.g. to close groups, gather
// memory reports).
type Finisher interface {
	Finish(t *Trainer) error
}

// FullParamser gathers the full value of every parameter when this rank
// does not hold them all (ZeRO-3 shards parameters). It is collective:
// every rank calls it. Saving weights and equivalence checks use it.
type FullParamser interface {
	FullParams(t *Trainer) (map[string][]float64, error)
}
