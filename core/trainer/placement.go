package trainer

import (
	"fmt"
	"slices"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/optim"
	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
	"github.com/tinyacc/tinyacc/core/trace"
)

// Everything that needs "the" value of a global parameter (the gradient
// norm, saving, the equivalence checks) goes through this file: it asks
// where this rank keeps its part (Holding), which elements of the global
// tensor those are (place.Spec), and whether this rank is the one that
// counts them (place.Spec.Owns), then combines over the world group. No
// strategy has a special case here.

// Coord is this rank's position on the mesh (place.Single without one).
func (t *Trainer) Coord() place.Coord {
	if t.Mesh == nil {
		return place.Single
	}
	return t.Mesh.Place()
}

// world is the group of every rank, nil for a single process.
func (t *Trainer) world() comm.Group {
	if t.Mesh == nil {
		return nil
	}
	return t.Mesh.WorldGroup()
}

// Holding returns where this rank keeps its part of parameter p: what a
// Holder plugin says, or else the tensor itself and its gradient, both
// laid out as p.Spec says.
func (t *Trainer) Holding(p *tensor.Tensor) (Holding, error) {
	var found []string
	var h Holding
	for _, pl := range t.Plugins {
		if hd, ok := pl.(Holder); ok {
			if got, ok := hd.Hold(t, p); ok {
				h = got
				found = append(found, pl.Name())
			}
		}
	}
	switch len(found) {
	case 0:
		h = Holding{Value: Part{Spec: p.Spec}, Grad: Part{Spec: p.Spec, Data: p.Grad}}
		if p.HasStorage() {
			h.Value.Data = p
		}
		if pp, ok := t.Opt.(optim.PerParam); ok && t.optimizes(p) {
			h.Opt, h.OptParam = pp, p
		}
	case 1:
	default:
		return Holding{}, fmt.Errorf("trainer: plugins %v all hold parameter %s; at most one may", found, p.Name)
	}
	if h.Value.Spec == nil || h.Grad.Spec == nil {
		return Holding{}, fmt.Errorf("trainer: parameter %s has no placement (was it registered through nn.Module?)", p.Name)
	}
	return h, nil
}

// optimizes reports whether the optimizer updates p itself. The set is
// built once per optimizer, not per call: Holding runs for every parameter
// at every step (the gradient norm).
func (t *Trainer) optimizes(p *tensor.Tensor) bool {
	if t.optSet.of != t.Opt {
		t.optSet.of, t.optSet.params = t.Opt, map[*tensor.Tensor]bool{}
		for _, q := range t.Opt.Params() {
			t.optSet.params[q] = true
		}
	}
	return t.optSet.params[p]
}

// GradSumSquares is the squared norm of the global gradient: each rank
// sums the squares of the gradient elements it owns, so that every global
// element counts exactly once (a replicated tensor on one rank of its
// replication group, the tied wte once though two stages hold it), then
// one all-reduce over the world adds the ranks' sums. Gradients must be
// reduced (PreStep) by then: a pending sum is an error.
//
// The same all-reduce carries whether any rank was asked to stop (a
// signal), so that every rank stops after the same step without a
// collective of its own.
func (t *Trainer) GradSumSquares() (float64, error) {
	// overflow flags a NaN or an infinity in any gradient this rank holds;
	// it is summed over the ranks with the norm (fp16 loss scaling).
	var s, overflow float64
	c := t.Coord()
	for _, p := range t.Model.Params() {
		h, err := t.Holding(p)
		if err != nil {
			return 0, err
		}
		g := h.Grad
		if g.Data == nil {
			continue
		}
		own, err := g.Spec.Owns(c)
		if err != nil {
			return 0, fmt.Errorf("trainer: gradient norm: %w", err)
		}
		if own {
			s += sumSquares(g.Data)
		} else if t.scaler != nil && !isFinite(sumSquares(g.Data)) {
			overflow = 1 // a replica this rank does not count in the norm
		}
	}
	if !isFinite(s) {
		overflow = 1
	}
	t.gradOverflow = overflow > 0
	w := t.world()
	if w == nil {
		return s, nil
	}
	stop := 0.0
	if t.stopWanted() {
		stop = 1
	}
	vals := []float64{s, stop}
	if t.scaler != nil {
		vals = append(vals, overflow) // only fp16 pays for the flag
	}
	buf := tensor.FromF64(vals, len(vals))
	span := t.Trace.Begin("all_reduce grad_norm", "comm", trace.Comm).With("bytes", buf.Bytes())
	err := w.AllReduce(buf, comm.Sum)
	span.End()
	if err != nil {
		return 0, fmt.Errorf("trainer: summing the gradient norm over the world: %w", err)
	}
	t.stopAgreed = buf.F64()[1] > 0
	if t.scaler != nil {
		t.gradOverflow = buf.F64()[2] > 0
	}
	return buf.F64()[0], nil
}

// stopWanted reports whether this rank was asked to stop (Run's context).
func (t *Trainer) stopWanted() bool { return t.ctx != nil && t.ctx.Err() != nil }

// Interrupted is Run's error when it stopped early because it was asked
// to (a signal): after Step steps, with the checkpoint it wrote ("" when
// checkpoint.dir is not set).
type Interrupted struct {
	Step       int
	Checkpoint string
}

func (e *Interrupted) Error() string {
	if e.Checkpoint == "" {
		return fmt.Sprintf("interrupted after %d steps; nothing saved (set checkpoint.dir to keep a run that is stopped)", e.Step)
	}
	return fmt.Sprintf("interrupted after %d steps; the training state is in %s (resume with --resume=%s)", e.Step, e.Checkpoint, e.Checkpoint)
}

func sumSquares(t *tensor.Tensor) float64 {
	if t.DType() == tensor.Float32 {
		return cpu.SumSquares(t.F32())
	}
	return cpu.SumSquares(t.F64())
}

// GatherParam returns the full value of global parameter name (a
// tensor of its global shape, in the model's dtype) on rank root, or on every rank when
// root < 0, and nil on the others. It is collective: every rank calls it,
// for the same names in the same order, whatever part it holds. Each rank
// writes the elements it owns into a zeroed global-sized buffer and the
// buffers are summed: owners are disjoint and cover the tensor, so the sum
// is exact. Only one global tensor exists at a time, in category Comm.
func (t *Trainer) GatherParam(ps nn.ParamShape, root int) (*tensor.Tensor, error) {
	buf := t.Alloc.New(tensor.Comm, t.DType(), ps.Shape...)
	if p := t.Model.Param(ps.Name); p != nil {
		h, err := t.Holding(p)
		if err != nil {
			buf.Release()
			return nil, err
		}
		v := h.Value
		if v.Spec == nil || !slices.Equal(v.Spec.Shape, ps.Shape) {
			buf.Release()
			return nil, fmt.Errorf("trainer: parameter %s is %v here but %v in the model's config", ps.Name, v.Spec, ps.Shape)
		}
		own, err := v.Spec.Owns(t.Coord())
		if err != nil {
			buf.Release()
			return nil, err
		}
		if own && v.Data != nil {
			if v.Data.DType() != buf.DType() {
				buf.Release()
				return nil, fmt.Errorf("trainer: parameter %s is %s; the model is %s", ps.Name, v.Data.DType(), buf.DType())
			}
			gatherInto(v.Spec, t.Coord(), v.Data, buf)
		}
	}
	w := t.world()
	if w == nil {
		return buf, nil
	}
	var err error
	span := t.Trace.Begin("gather "+ps.Name, "comm", trace.Comm).With("bytes", buf.Bytes())
	if root < 0 {
		err = w.AllReduce(buf, comm.Sum)
	} else {
		err = w.Reduce(buf, root, comm.Sum)
	}
	span.End()
	if err != nil {
		buf.Release()
		return nil, fmt.Errorf("trainer: gathering %s over the world: %w", ps.Name, err)
	}
	if root >= 0 && w.Rank() != root {
		buf.Release()
		return nil, nil
	}
	return buf, nil
}

// MeanOver returns the mean of v over the ranks of g (one all-reduce):
// what a plugin whose group splits the batch into equal parts does to
// turn a rank's mean loss into the group's (LossReducer).
func (t *Trainer) MeanOver(g comm.Group, v float64) (float64, error) {
	buf := tensor.FromF64([]float64{v}, 1)
	span := t.Trace.Begin("all_reduce loss", "comm", trace.Comm).With("bytes", buf.Bytes()).With("group", g.Name())
	err := g.AllReduce(buf, comm.Avg)
	span.End()
	if err != nil {
		return 0, fmt.Errorf("averaging the loss over group %s: %w", g.Name(), err)
	}
	return buf.F64()[0], nil
}

// gatherInto writes the part data of a tensor placed as s holds at c into
// global, both of one floating dtype.
func gatherInto(s *place.Spec, c place.Coord, data, global *tensor.Tensor) {
	if global.DType() == tensor.Float32 {
		place.Gather(s, c, data.F32(), global.F32())
	} else {
		place.Gather(s, c, data.F64(), global.F64())
	}
}
