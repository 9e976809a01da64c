package trainer

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// Result summarises a finished run. It keeps no per-step history, so a
// run's memory stays flat however many steps it has: a caller that wants
// every step's metrics sets Options.OnStep or reads metrics_file.
type Result struct {
	StepsRun  int // optimizer steps completed
	Skipped   int // steps whose update train.nonfinite=skip dropped
	Last      StepMetrics
	Evals     []EvalPoint // one per evaluation (train.eval_every)
	Memory    []MemoryReport
	Duration  time.Duration
	FirstLoss float64
	LastLoss  float64
}

// EvalPoint is one validation loss.
type EvalPoint struct {
	Step int     `json:"step"`
	Loss float64 `json:"loss"`
}

// MemoryReport is one rank's accounting at the end of a run.
type MemoryReport struct {
	Rank        int   `json:"rank"`
	ParamsBytes int64 `json:"params_bytes"`
	GradsBytes  int64 `json:"grads_bytes"`
	OptimBytes  int64 `json:"optim_bytes"`
	ActPeak     int64 `json:"activations_peak_bytes"`
	CommBytes   int64 `json:"comm_bytes"`
	PeakBytes   int64 `json:"peak_bytes"`
}

// MemoryGatherer collects every rank's memory report on rank 0 (data
// parallel plugins implement it; without one only this rank reports).
type MemoryGatherer interface {
	GatherMemory(t *Trainer, mine MemoryReport) ([]MemoryReport, error)
}

// Memory returns this rank's memory report from its allocator.
func (t *Trainer) Memory() MemoryReport {
	u := t.Alloc.Usage()
	return MemoryReport{Rank: t.Rank,
		ParamsBytes: u.Peak[tensor.Params], GradsBytes: u.Peak[tensor.Grads],
		OptimBytes: u.Peak[tensor.OptimState], ActPeak: u.Peak[tensor.Activations],
		CommBytes: u.Peak[tensor.Comm], PeakBytes: u.TotalPeak}
}

// Run trains for cfg.Train.Steps steps with periodic evaluation, then saves
// the weights if asked and reports memory. It stops early, with ctx's
// error, when ctx is cancelled.
func (t *Trainer) Run(ctx context.Context) (*Result, error) {
	cfg := t.Cfg
	res := &Result{}
	start := time.Now()
	lead := t.Rank == 0
	log := t.opts.Log
	if !lead {
		log = io.Discard
	}
	if lead {
		fmt.Fprintf(log, "tinyacc: GPT %d layers, %d heads, %d wide, context %d, vocab %d: %.2fM parameters\n",
			cfg.Model.NLayer, cfg.Model.NHead, cfg.Model.NEmbd, cfg.Model.BlockSize, cfg.Model.VocabSize,
			float64(GPTConfig(cfg).NumParams())/1e6)
		if t.opts.Corpus != "" {
			fmt.Fprintf(log, "tinyacc: data %s; %d training tokens, %d validation\n", t.opts.Corpus, t.Train.Len(), valLen(t))
		}
		global := cfg.Train.BatchSize * cfg.Train.GradAccum * t.DataSize
		fmt.Fprintf(log, "tinyacc: %d steps of %d sequences (%d tokens); ranks %d\n",
			cfg.Train.Steps, global, global*cfg.Model.BlockSize, t.World)
	}
	evalEvery := cfg.Train.EvalEvery
	logEvery := max(1, cfg.Train.LogEvery)
	lineOpen := false // a live progress line waits for its newline
	for s := 0; s < cfg.Train.Steps; s++ {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		m, err := t.Step(s)
		if err != nil {
			return res, fmt.Errorf("step %d: %w", s, err)
		}
		if res.StepsRun == 0 {
			res.FirstLoss = m.Loss
		}
		res.StepsRun++
		res.Last, res.LastLoss = m, m.Loss
		if m.Skipped {
			res.Skipped++
		}
		if t.opts.OnStep != nil {
			t.opts.OnStep(m)
		}
		if t.metrics != nil {
			if err := t.metrics.Write("train", m); err != nil {
				return res, err
			}
		}
		last := s == cfg.Train.Steps-1
		if lead && (s%logEvery == 0 || last) {
			line := fmt.Sprintf("step %*d/%d  loss %.4f  lr %.2e  norm %.3f  %6.0f ms  %7.0f tok/s  mfu %.1f%%",
				len(fmt.Sprint(cfg.Train.Steps)), s+1, cfg.Train.Steps, m.Loss, m.LR, m.GradNorm, m.StepMS, m.TokensPerS, 100*m.MFU)
			if t.opts.Live {
				fmt.Fprintf(log, "\r%s\x1b[K", line)
				lineOpen = true
			} else {
				fmt.Fprintln(log, line)
			}
		}
		if t.Val != nil && ((evalEvery > 0 && (s+1)%evalEvery == 0) || last) {
			vl, err := t.Evaluate()
			if err != nil {
				return res, err
			}
			res.Evals = append(res.Evals, EvalPoint{Step: s, Loss: vl})
			if t.metrics != nil {
				if err := t.metrics.Write("eval", EvalPoint{Step: s, Loss: vl}); err != nil {
					return res, err
				}
			}
			if lead {
				if lineOpen {
					fmt.Fprintln(log)
					lineOpen = false
				}
				fmt.Fprintf(log, "eval step %d: val loss %.4f\n", s+1, vl)
			}
		}
	}
	if lead && lineOpen {
		fmt.Fprintln(log)
	}
	res.Duration = time.Since(start)
	if cfg.SaveTo != "" {
		if err := t.save(cfg.SaveTo, lead); err != nil {
			return res, err
		}
		fmt.Fprintf(log, "tinyacc: saved weights to %s\n", cfg.SaveTo)
	}
	mine := t.Memory()
	res.Memory = []MemoryReport{mine}
	for _, p := range t.Plugins {
		if g, ok := p.(MemoryGatherer); ok {
			all, err := g.GatherMemory(t, mine)
			if err != nil {
				return res, err
			}
			res.Memory = all
		}
	}
	for _, p := range t.Plugins {
		if f, ok := p.(Finisher); ok {
			if err := f.Finish(t); err != nil {
				return res, fmt.Errorf("trainer: finish %s: %w", p.Name(), err)
			}
		}
	}
	if lead {
		WriteMemoryTable(log, res.Memory)
		if t.metrics != nil {
			for _, r := range res.Memory {
				if err := t.metrics.Write("memory", r); err != nil {
					return res, err
				}
			}
		}
	}
	if t.metrics != nil {
		if err := t.metrics.Close(); err != nil {
			return res, err
		}
	}
	return res, nil
}

func valLen(t *Trainer) int {
	if t.Val == nil {
		return 0
	}
	return t.Val.Len()
}

// WriteMemoryTable prints the per-rank memory table that ends a run.
func WriteMemoryTable(w io.Writer, rs []MemoryReport) {
	mib := func(b int64) string { return fmt.Sprintf("%.2f", float64(b)/(1<<20)) }
	fmt.Fprintf(w, "memory (MiB)  %6s %10s %10s %10s %12s %10s %10s\n", "rank", "params", "grads", "optim", "activations", "comm", "peak")
	for _, r := range rs {
		fmt.Fprintf(w, "              %6d %10s %10s %10s %12s %10s %10s\n", r.Rank, mib(r.ParamsBytes), mib(r.GradsBytes),
			mib(r.OptimBytes), mib(r.ActPeak), mib(r.CommBytes), mib(r.PeakBytes))
	}
}

// save writes the model's weights (rank 0 only). When a plugin shards the
// parameters, every rank first takes part in gathering them.
func (t *Trainer) save(path string, lead bool) error {
	for _, p := range t.Plugins {
		g, ok := p.(FullParamser)
		if !ok {
			continue
		}
		full, err := g.FullParams(t)
		if err != nil {
			return fmt.Errorf("save_to: gathering parameters: %w", err)
		}
		if !lead {
			return nil
		}
		m, err := nn.NewGPT(t.Model.Config, 0, tensor.Float32, nil)
		if err != nil {
			return err
		}
		for _, q := range m.Params() {
			v, ok := full[q.Name]
			if !ok {
				return fmt.Errorf("save_to: %s gathered no %s", p.Name(), q.Name)
			}
			for i, x := range v {
				q.Set(i, x)
			}
		}
		return SaveWeights(m, path, t.Cfg)
	}
	if !lead {
		return nil
	}
	return SaveWeights(t.Model, path, t.Cfg)
}
