package pp

import (
	"fmt"
	"time"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trace"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// Pipeline is the pipeline-parallel plugin of one rank: it keeps this
// rank's stage of the model (Prepare) and owns the step, running its list
// of the schedule (RunStep). It implements trainer.Preparer and
// trainer.StepOwner.
type Pipeline struct {
	sched *Schedule
	split []int // blocks per model chunk
	group comm.Group
	// embed is the group of the first and the last stage at this rank's
	// other coordinates (nil on middle stages): the tied wte's gradient
	// is summed over it.
	embed comm.Group
	rank  int
}

// New builds the pipeline plugin of cfg over mesh m: it generates the
// schedule of pp.schedule for parallel.pp stages, pp.virtual_stages
// chunks per rank and train.grad_accum micro-batches, checks it (a
// schedule that would deadlock or skip a micro-batch never runs), splits
// the blocks (pp.layers, or balanced by compute) and creates the
// embedding groups. Every rank of m's world must call it, in the same
// order relative to its other group creations.
func New(cfg config.Config, m *mesh.Mesh) (*Pipeline, error) {
	sh := m.Shape()
	p, v := sh.PP, cfg.PP.VirtualStages
	s, err := Generate(cfg.PP.Schedule, p, v, cfg.Train.GradAccum)
	if err != nil {
		return nil, err
	}
	if err := s.Check(); err != nil {
		return nil, err
	}
	split, err := cfg.PPLayers()
	if err != nil {
		return nil, err
	}
	if split == nil {
		if split, err = Balance(trainer.GPTConfig(cfg), p*v); err != nil {
			return nil, err
		}
	}
	pl := &Pipeline{sched: s, split: split, group: m.PP(), rank: m.PPRank()}
	// One embedding group per (dp, cp, tp) position, created on every
	// rank in the same order.
	for dp := 0; dp < sh.DP; dp++ {
		for cp := 0; cp < sh.CP; cp++ {
			for tp := 0; tp < sh.TP; tp++ {
				ends := []int{sh.Rank(mesh.Coord{TP: tp, CP: cp, DP: dp, PP: 0}), sh.Rank(mesh.Coord{TP: tp, CP: cp, DP: dp, PP: p - 1})}
				g, err := m.WorldGroup().NewNamedGroup("pp-embed", ends)
				if err != nil {
					return nil, fmt.Errorf("pp: embedding group %v: %w", ends, err)
				}
				if g != nil {
					pl.embed = g
				}
			}
		}
	}
	return pl, nil
}

// Name implements trainer.Plugin.
func (o *Pipeline) Name() string { return "pp" }

// Schedule is the schedule every rank runs.
func (o *Pipeline) Schedule() *Schedule { return o.sched }

// Split is the number of blocks of each model chunk.
func (o *Pipeline) Split() []int { return o.split }

// Prepare keeps this rank's stage of the model and marks the tied wte,
// whose gradient RunStep finishes itself. On a described model
// (trainer.New) the other stages never get storage; a model built with
// its weights (NewWith) has the rest freed by trainer.SetModel and its
// optimizer rebuilt over what is left.
func (o *Pipeline) Prepare(t *trainer.Trainer) error {
	stage, err := keepStage(t.Model, o.split, o.sched.P, o.rank)
	if err != nil {
		return err
	}
	if err := t.SetModel(stage); err != nil {
		return err
	}
	if wte := t.Model.Param(t.Model.Config.TiedTable()); wte != nil {
		t.KeepGradReady(wte)
	}
	// Trace times are per process; this event ties them to the wall
	// clock so `tinyacc pp draw --trace` lines ranks up.
	span := t.Trace.Begin(clockEvent, "pp-clock", trace.Compute).With("unix_us", float64(time.Now().UnixMicro())).
		With("pp", o.sched.P).With("virtual", o.sched.V).With("schedule", o.sched.Name)
	span.End()
	return nil
}

// slot is what one (chunk, micro-batch) pair holds between its actions.
type slot struct {
	in       *tensor.Tensor // received input activation (a leaf), nil on chunk 0
	out      *tensor.Tensor // the chunk's output, or the loss on the last chunk
	gradOut  *tensor.Tensor // received gradient of out
	deferred *tensor.Deferred
}

// RunStep implements trainer.StepOwner: it runs this rank's list of the
// schedule, then sums the tied wte's gradient over the embedding group
// and returns the last stage's mean loss, on every stage.
func (o *Pipeline) RunStep(t *trainer.Trainer, step int) (float64, error) {
	s := o.sched
	A, B := s.M, t.Cfg.Train.BatchSize
	last := s.Chunks() - 1
	slots := map[[2]int]*slot{}
	var lossSum float64
	for n, a := range s.Ranks[o.rank] {
		key := [2]int{a.Chunk, a.Micro}
		sl := slots[key]
		if sl == nil {
			sl = &slot{}
			slots[key] = sl
		}
		info := t.TrainPass(step, a.Micro)
		k := a.Chunk / s.P // this rank's chunk index
		var err error
		switch a.Kind {
		case RecvAct:
			x, _ := t.Train.Batch(step, a.Micro, t.DataRank, t.DataSize, B, A)
			sl.in = t.Alloc.New(tensor.Activations, t.DType(), x.Dim(0), x.Dim(1)/t.SeqParts, t.Model.Config.NEmbd)
			span := o.commSpan(t, "recv", "act", a.Chunk-1, a.Micro, step)
			err = comm.RecvAs(o.group, sl.in, a.Peer, t.Alloc.Compute())
			span.End()
			if err == nil {
				sl.in.RequiresGrad()
			}
		case Forward:
			if err = t.PreForward(info); err != nil {
				break
			}
			x, y := t.Train.Batch(step, a.Micro, t.DataRank, t.DataSize, B, A)
			span := o.span(t, a, step)
			sl.out, err = o.forward(t, k, a.Chunk == 0, a.Chunk == last, sl.in, x, y, info)
			span.End()
			if err == nil && a.Chunk == last {
				lossSum += sl.out.Scalar()
			}
		case SendAct:
			span := o.commSpan(t, "send", "act", a.Chunk, a.Micro, step)
			err = comm.SendAs(o.group, sl.out, a.Peer, t.Alloc.Compute())
			span.End()
		case RecvGrad:
			sl.gradOut = t.Alloc.New(tensor.Activations, t.DType(), sl.out.Shape()...)
			span := o.commSpan(t, "recv", "grad", a.Chunk+1, a.Micro, step)
			err = comm.RecvAs(o.group, sl.gradOut, a.Peer, t.Alloc.Compute())
			span.End()
		case Backward:
			if a.Chunk == last {
				// Each micro-batch contributes 1/A of the step's mean loss.
				sl.gradOut = t.Alloc.New(tensor.Activations, sl.out.DType(), sl.out.Shape()...)
				sl.gradOut.Set(0, t.LossSeed(1/float64(A)))
			}
			span := o.span(t, a, step)
			if s.Split {
				sl.deferred, err = t.BackwardSplit(sl.out, sl.gradOut, info)
			} else {
				err = t.BackwardFrom(sl.out, sl.gradOut, info)
			}
			span.End()
			sl.out.Release()
			sl.gradOut.Release()
			if err == nil && !s.Split && k == 0 {
				// This rank's last chunk of the micro-batch is done.
				err = t.PostGrad(info)
			}
		case Weight:
			span := o.span(t, a, step)
			err = t.RunDeferred(sl.deferred, info)
			span.End()
			if err == nil && k == 0 {
				err = t.PostGrad(info)
			}
		case SendGrad:
			span := o.commSpan(t, "send", "grad", a.Chunk, a.Micro, step)
			err = comm.SendAs(o.group, sl.in.Grad, a.Peer, t.Alloc.Compute())
			span.End()
		}
		if err != nil {
			return 0, fmt.Errorf("pp: stage %d, action %d of step %d (%s): %w", o.rank, n, step, a, err)
		}
		if o.slotDone(a) {
			if sl.in != nil {
				if sl.in.Grad != nil {
					sl.in.Grad.Release()
				}
				sl.in.Release()
			}
			delete(slots, key)
		}
	}
	if err := o.tiedGrad(t); err != nil {
		return 0, err
	}
	return o.shareLoss(lossSum / float64(A))
}

// slotDone reports whether a is the last action of its (chunk, micro)
// pair on this rank: W when backward is split, else the backward's send
// (or the backward itself on chunk 0).
func (o *Pipeline) slotDone(a Action) bool {
	switch {
	case o.sched.Split:
		return a.Kind == Weight
	case a.Chunk == 0:
		return a.Kind == Backward
	}
	return a.Kind == SendGrad
}

// span opens the trace span of a compute action; `pp draw --trace` and
// `bench pp` read them back.
func (o *Pipeline) span(t *trainer.Trainer, a Action, step int) trace.Span {
	return t.Trace.Begin(a.Kind.String(), traceCat, trace.Compute).
		With("step", step).With("chunk", a.Chunk).With("micro", a.Micro)
}

// commSpan traces a transfer between stages; chunk is the sending
// chunk's, on both sides, so FromTrace can pair the two ends.
func (o *Pipeline) commSpan(t *trainer.Trainer, name, kind string, chunk, micro, step int) trace.Span {
	return t.Trace.Begin(name, commCat, trace.Comm).
		With("step", step).With("kind", kind).With("chunk", chunk).With("micro", micro)
}

// forward runs this rank's chunk k on one micro-batch: from the token ids
// x through the embedding on the first chunk, else from the received
// activation in; through the head to the loss against y on the last.
func (o *Pipeline) forward(t *trainer.Trainer, k int, first, last bool, in, x, y *tensor.Tensor, info tensor.PassInfo) (*tensor.Tensor, error) {
	m, pass := t.Model, nn.Pass{Info: info}
	h := in
	var err error
	if first {
		if h, err = m.Embed.Forward(x, pass); err != nil {
			return nil, err
		}
	}
	if h, err = m.Chunks[k].Forward(h, pass); err != nil {
		return nil, err
	}
	if last {
		return m.Head.Loss(h, y, pass)
	}
	return h, nil
}

// tiedGrad sums the tied wte's gradient over the first and the last
// stage (the embedding's part plus the head's) and only then tells the
// other plugins it is final, so data parallel reduces the sum. It runs
// after the rank's whole list: both ends have finished their compute, so
// neither waits on the other's pipeline traffic.
func (o *Pipeline) tiedGrad(t *trainer.Trainer) error {
	wte := t.Model.Param(t.Model.Config.TiedTable()) // none: an untied Llama
	if wte == nil || !wte.NeedsGrad() {
		return nil // or a frozen table (LoRA): no gradient to sum
	}
	if wte.Grad == nil {
		return fmt.Errorf("pp: stage %d holds %s but backward gave it no gradient", o.rank, wte.Name)
	}
	span := t.Trace.Begin("all_reduce wte (embedding group)", "comm", trace.Comm).With("bytes", wte.Grad.Bytes())
	err := o.embed.AllReduce(wte.Grad, comm.Sum)
	span.End()
	if err != nil {
		return fmt.Errorf("pp: stage %d: sum of the tied wte's gradient over the first and last stage: %w", o.rank, err)
	}
	return t.GradReady(wte, tensor.PassInfo{Micro: o.sched.M - 1, Last: true})
}

// shareLoss gives every stage the last stage's value.
func (o *Pipeline) shareLoss(v float64) (float64, error) {
	buf := tensor.FromF64([]float64{v}, 1)
	if err := o.group.Broadcast(buf, o.sched.P-1); err != nil {
		return 0, fmt.Errorf("pp: stage %d: broadcast of the loss from the last stage: %w", o.rank, err)
	}
	return buf.F64()[0], nil
}

// EvalLoss implements trainer.StepOwner: the batch (x, y) goes forward
// through every chunk in model order, with no backward, and the last
// stage's loss is shared with every stage.
func (o *Pipeline) EvalLoss(t *trainer.Trainer, x, y *tensor.Tensor) (float64, error) {
	s := o.sched
	last := s.Chunks() - 1
	var v float64
	info := tensor.PassInfo{Last: true}
	for c := o.rank; c <= last; c += s.P {
		var in *tensor.Tensor
		if c > 0 {
			in = t.Alloc.New(tensor.Activations, t.DType(), x.Dim(0), x.Dim(1)/t.SeqParts, t.Model.Config.NEmbd)
			if err := comm.RecvAs(o.group, in, s.RankOf(c-1), t.Alloc.Compute()); err != nil {
				return 0, fmt.Errorf("pp: stage %d: evaluation input of chunk %d: %w", o.rank, c, err)
			}
		}
		out, err := o.forward(t, c/s.P, c == 0, c == last, in, x, y, info)
		if err != nil {
			return 0, err
		}
		if c == last {
			v = out.Scalar()
		} else if err := comm.SendAs(o.group, out, s.RankOf(c+1), t.Alloc.Compute()); err != nil {
			return 0, fmt.Errorf("pp: stage %d: evaluation output of chunk %d: %w", o.rank, c, err)
		}
		tensor.FreeGraph(out)
		out.Release()
		if in != nil {
			in.Release()
		}
	}
	return o.shareLoss(v)
}
