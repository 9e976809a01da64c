package trainer

import (
	"github.com/tinyacc/tinyacc/core/optim"
	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// Plugin is a parallelism strategy (or any extension) attached to the loop.
// It implements only the hook interfaces below that it needs; the trainer
// finds them with type assertions.
//
// How hooks combine when several plugins implement one. The plugins of a
// run come in one order, decided by the registry (plugins.Build): model
// rewriters first (tensor parallel, then context parallel), then the step
// owner (pipeline parallel), then data parallel (DDP or ZeRO). Then:
//
//   - Side-effect hooks (Preparer, PreForwarder, GradReadier, GradNeeder,
//     PostGrader, PreStepper, PostStepper, Finisher) all run, in plugin
//     order. The first error ends the hook and the step, except GradReady
//     and NeedGrad: every plugin is told of every parameter during
//     backward (collectives started there must be issued alike on every
//     rank), and the first error is returned once backward is done.
//   - Value hooks compose. LossReducer: each reduces the value the
//     previous one returned, so a loss is reduced once over each group
//     that splits the batch (data parallel over dp, or dp × cp; context
//     parallel's head averages over cp in forward); a group that does not
//     split the batch (tensor parallel, whose ranks compute the same
//     loss) reduces nothing. MemoryGatherer: each
//     receives the reports gathered so far and returns them amended.
//   - At most one plugin owns the step (StepOwner); a second is an error
//     before training. Likewise at most one plugin holds a given
//     parameter's data elsewhere (Holder).
type Plugin interface {
	Name() string
}

// Preparer runs once before training. It may replace layers of the model
// (tensor parallel swaps Linear layers, context parallel the attention
// core; see nn.Layer), replace the model by the stage this rank holds
// (Trainer.SetModel), wrap the optimizer (ZeRO shards it) or change which
// data this rank reads (DataRank, DataSize).
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

// GradNeeder is told, during backward, that an op is about to add the
// first contribution of the pass to parameter p's gradient while p has
// no Grad: it may give p one (Backprop's NeedGrad). ZeRO allocates a tied
// table's gradient there, after the head's last read of the table's
// gathered values, so the gradient takes their buffer.
type GradNeeder interface {
	NeedGrad(t *Trainer, p *tensor.Tensor, info tensor.PassInfo) error
}

// PostGrader runs after each micro-batch's backward.
type PostGrader interface {
	PostGrad(t *Trainer, info tensor.PassInfo) error
}

// PreStepper runs after the last micro-batch, before the gradient norm,
// clipping and the optimizer step (data parallel waits for its buckets
// here; a gradient that is a pending sum must be reduced by then).
type PreStepper interface {
	PreStep(t *Trainer) error
}

// PostStepper runs after the optimizer step (ZeRO all-gathers updated
// parameters here) and sees the step's metrics.
type PostStepper interface {
	PostStep(t *Trainer, m *StepMetrics) error
}

// StepOwner runs the forward and backward passes of a whole step itself
// (a pipeline schedule). At most one plugin may own the step.
type StepOwner interface {
	// RunStep runs every micro-batch of step, forward and backward (with
	// Trainer.BackwardFrom, so GradReady fires as usual), and returns the
	// same quantity the trainer's own loop computes: this rank's mean loss
	// over its micro-batches, known on every rank of the owner's group (a
	// pipeline sends the last stage's value to the others). The trainer
	// then runs the LossReducers on it exactly as on its own loss.
	RunStep(t *Trainer, step int) (loss float64, err error)
	// EvalLoss returns the mean loss of one evaluation micro-batch (x, y
	// [B, T]) without recording gradients, on every rank of the owner's
	// group. Trainer.Evaluate goes through it and reduces the mean over
	// the micro-batches with the LossReducers.
	EvalLoss(t *Trainer, x, y *tensor.Tensor) (float64, error)
}

// LossReducer turns a loss that is the mean over part of the batch into
// the mean over the group that splits it (an average over data-parallel
// ranks): each step's training loss, and each evaluation's validation
// loss, whose batches are split the same way. See Plugin for how several
// compose.
type LossReducer interface {
	ReduceLoss(t *Trainer, loss float64) (float64, error)
}

// Finisher runs once after the last step (e.g. to close groups).
type Finisher interface {
	Finish(t *Trainer) error
}

// MemoryGatherer amends the per-rank memory reports the trainer gathered
// over the world (a plugin that keeps buffers the allocators do not see,
// such as a plugin process, adds them). See Plugin for how several
// compose.
type MemoryGatherer interface {
	GatherMemory(t *Trainer, all []MemoryReport) ([]MemoryReport, error)
}

// Holder is a plugin that keeps a parameter's authoritative value or
// gradient somewhere other than the parameter tensor itself (ZeRO keeps
// flat shards). The gradient norm, checkpoints and equivalence checks find
// a parameter's data through Trainer.Holding, which asks the holders.
type Holder interface {
	// Hold returns where this rank keeps its part of p, and false when
	// the plugin does not hold p.
	Hold(t *Trainer, p *tensor.Tensor) (Holding, bool)
}

// Holding is where this rank keeps its part of a parameter: its value,
// its gradient (after PreStep: reduced as the optimizer will use it), and
// the optimizer's state of it, laid out like the gradient part.
type Holding struct {
	Value, Grad Part
	// Opt and OptParam give the optimizer's state of this part:
	// Opt.StateOf(OptParam). OptParam is nil when the optimizer updates
	// none of the parameter on this rank.
	Opt      optim.PerParam
	OptParam *tensor.Tensor
}

// Part is some elements of a global tensor: Spec says which, and Data
// holds them in the order Spec.Runs gives (nil: this rank holds none).
type Part struct {
	Spec *place.Spec
	Data *tensor.Tensor
}
