package pp

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// Estimator is the pipeline's term of the memory estimate
// (trainer.MemoryEstimator and trainer.ParamLocalizer): the parameters of
// this rank's stage, and the activations its list of the schedule keeps
// alive at once, found by playing the list as RunStep runs it.
type Estimator struct {
	sched *Schedule
	split []int
}

// NewEstimator builds the estimator of cfg's pipeline of p stages from the
// config alone: the same schedule and split New makes.
func NewEstimator(cfg config.Config, p int) (*Estimator, error) {
	s, err := Generate(cfg.PP.Schedule, p, cfg.PP.VirtualStages, cfg.Train.GradAccum)
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
		if split, err = Balance(trainer.GPTConfig(cfg), p*cfg.PP.VirtualStages); err != nil {
			return nil, err
		}
	}
	return &Estimator{sched: s, split: split}, nil
}

// stage is the pipeline rank of a world rank: pp is the outermost mesh
// dimension.
func (e *Estimator) stage(in trainer.EstimateInput) int {
	return in.Rank / max(1, in.World/e.sched.P)
}

// chunkOf maps block i to its model chunk.
func (e *Estimator) chunkOf(i int) int {
	for c, n := range e.split {
		if i < n {
			return c
		}
		i -= n
	}
	return -1
}

// LocalParams implements trainer.ParamLocalizer: what keepStage keeps,
// the blocks of this rank's chunks, the embedding (wte, wpe) on the first
// stage, the final LayerNorm and the tied wte on the last.
func (e *Estimator) LocalParams(in trainer.EstimateInput, ps []nn.ParamShape) []nn.ParamShape {
	r, p := e.stage(in), e.sched.P
	var out []nn.ParamShape
	for _, q := range ps {
		keep := false
		switch {
		case q.Name == in.Model.TiedTable():
			keep = r == 0 || r == p-1
		case q.Name == "wpe.weight" || q.Name == nn.LlamaEmbedName:
			keep = r == 0
		case strings.HasPrefix(q.Name, "ln_f.") || q.Name == nn.LlamaNormName || q.Name == nn.LlamaHeadName:
			keep = r == p-1
		case strings.HasPrefix(q.Name, "h."):
			i, err := strconv.Atoi(strings.SplitN(q.Name, ".", 3)[1])
			keep = err == nil && e.chunkOf(i)%p == r
		case strings.HasPrefix(q.Name, "model.layers."):
			i, err := strconv.Atoi(strings.SplitN(q.Name, ".", 4)[2])
			keep = err == nil && e.chunkOf(i)%p == r
		}
		if keep {
			out = append(out, q)
		}
	}
	return out
}

// chunkTerms are the activation floats of one micro-batch on chunk c, as
// the executor and the autograd tape allocate them: trainer.PassActs for
// the chunk's blocks (its first K fully recomputed, counting this rank's
// blocks in model order as recompute.blocks does), with the embeddings'
// outputs before the first chunk and a received input B·T·C before the
// others, the output stage's terms after the last and a received output
// gradient B·T·C after the others (held beside the backward's copy of it):
//
//   - saved, from its forward to its backward: PassActs.Saved;
//   - full, during its backward: PassActs.Peak, freeing as it goes (a
//     split backward frees nothing: held);
//   - held, after a split backward until its W: the deferred pass's
//     PassActs.Peak, since the deferred weight gradients keep the
//     backward's graph and its gradients alive until then.
//
// Under tensor parallel over n ranks the head- and MLP-internal parts
// divide by n (trainer.BlockActsOf). A chunk's MoE blocks add
// trainer.MoEBlockFloats each to all three, in float32 bytes.
func (e *Estimator) chunkTerms(cfg config.Config, m nn.GPTConfig, c, r int) (saved, full, held int64) {
	first, last := c == 0, c == e.sched.Chunks()-1
	l := trainer.ActLayout{TP: cfg.Parallel.TP, SP: cfg.TP.SequenceParallel}
	p := trainer.ModelPass(cfg, m, l)
	bt := int64(cfg.Train.BatchSize) * int64(m.BlockSize)
	btc := bt * int64(m.NEmbd)
	before := 0 // this rank's blocks before chunk c
	for d := r; d < c; d += e.sched.P {
		before += e.split[d]
	}
	p.L = e.split[c]
	p.K = 0
	if cfg.Recompute.Granularity == "full" {
		p.K = p.L
		if n := cfg.Recompute.Blocks; n > 0 {
			p.K = min(p.L, max(0, n-before))
		}
	}
	if !first {
		p.Pre = btc
	}
	if !last {
		p.Head, p.Grad, p.HeldHead, p.HeadHalf = 0, btc, btc, 0
	}
	saved, full = p.Saved(), p.Peak()
	if !last {
		full += 4 * btc // the received gradient, beside the backward's copy
	}
	p.DeferredPass = true
	held = p.Peak()
	if e.sched.Split {
		full = held // a split backward frees nothing before its W
	}
	// The chunk's MoE blocks add their difference from a dense block, by
	// the one rule of the whole model's estimate (expert parallel's worst
	// case and exchange buffers included), for as long as the micro-batch
	// is alive.
	start := 0
	for d := 0; d < c; d++ {
		start += e.split[d]
	}
	var blocks int64
	for i := start; i < start+e.split[c]; i++ {
		if m.MoE.IsMoE(i) {
			blocks++
		}
	}
	moe := 4 * blocks * trainer.MoEBlockFloats(m, bt, cfg.Parallel.EP, cfg.Parallel.TP) // float32 in every precision
	deferred := moe + 4*blocks*trainer.MoEDeferredFloats(m, bt, cfg.Parallel.EP, cfg.Parallel.TP)
	if e.sched.Split {
		return saved + moe, full + deferred, held + deferred
	}
	return saved + moe, full + moe, held + deferred
}

// play runs rank r's list as RunStep does and returns the activation
// peak in bytes and the most input gradients (B·T·C each, counted as
// gradients: they are the received leaves' gradients) alive at once.
func (e *Estimator) play(cfg config.Config, m nn.GPTConfig, r int) (peak int64, inGrads int) {
	s := e.sched
	alive := map[[2]int]int64{} // what each live (chunk, micro) holds
	sum := func(except [2]int) int64 {
		var n int64
		for k, v := range alive {
			if k != except {
				n += v
			}
		}
		return n
	}
	grads := 0
	for _, a := range s.Ranks[r] {
		key := [2]int{a.Chunk, a.Micro}
		saved, full, held := e.chunkTerms(cfg, m, a.Chunk, r)
		switch a.Kind {
		case Forward:
			alive[key] = saved
			peak = max(peak, sum(key)+saved)
		case Backward:
			peak = max(peak, sum(key)+full)
			if a.Chunk != 0 {
				grads++
				inGrads = max(inGrads, grads)
			}
			if s.Split {
				alive[key] = held
			} else {
				delete(alive, key)
			}
		case Weight:
			peak = max(peak, sum(key)+full)
			delete(alive, key)
		}
		if a.Chunk != 0 && ((s.Split && a.Kind == Weight) || (!s.Split && a.Kind == SendGrad)) {
			grads--
		}
	}
	return peak, inGrads
}

// EstimateMemory implements trainer.MemoryEstimator: the core has
// counted the stage's parameters (LocalParams); the activations are the
// peak of this rank's list, and the received inputs' gradients alive at
// once add to the gradients.
func (e *Estimator) EstimateMemory(in trainer.EstimateInput, est *trainer.MemoryEstimate) error {
	r := e.stage(in)
	if r >= e.sched.P {
		return fmt.Errorf("pp: rank %d is outside a pipeline of %d stages over %d ranks", in.Rank, e.sched.P, in.World)
	}
	B := in.Cfg.Train.BatchSize
	// Under context parallel every sequence-sized tensor of a stage holds
	// T/cp rows of the sequence, the received inputs and their gradients
	// included (as cp's estimator says of one process).
	m := in.Model
	if cp := in.Cfg.Parallel.CP; cp > 1 {
		m.BlockSize /= cp
	}
	peak, inGrads := e.play(in.Cfg, m, r)
	est.ActPeak = peak + 1024
	est.GradsBytes += 4 * int64(inGrads) * int64(B) * int64(m.BlockSize) * int64(m.NEmbd)
	est.PeakBytes = est.ParamsBytes + est.GradsBytes + est.OptimBytes + est.ActPeak + est.CommBytes
	return nil
}
