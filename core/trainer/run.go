package trainer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/optim"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trace"
)

// Result summarises a finished run. It keeps no per-step or
// per-evaluation history, so a run's memory stays flat however many steps
// and evaluations it has: a caller that wants every step's metrics or
// every validation loss sets Options.OnStep or Options.OnEval, or reads
// metrics_file.
type Result struct {
	StepsRun int // optimizer steps completed
	Skipped  int // steps whose update train.nonfinite=skip dropped
	Last     StepMetrics
	// LastEval is the last evaluation (train.eval_every, and after the
	// last step); its Step is 0 when none ran.
	LastEval  EvalPoint
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
	// The most bytes a checkpoint save and a checkpoint load added at once
	// (0 when there was none).
	SavePeakBytes int64 `json:"checkpoint_save_peak_bytes"`
	LoadPeakBytes int64 `json:"checkpoint_load_peak_bytes"`
	// RSSPeakBytes is the process's resident peak (VmHWM) beside the
	// allocator's figures: what the kernel saw, runtime and data included
	// (goroutine ranks share one process, so they report the same).
	RSSPeakBytes int64 `json:"rss_peak_bytes"`
}

// Memory returns this rank's memory report from its allocator.
func (t *Trainer) Memory() MemoryReport {
	u := t.Alloc.Usage()
	return MemoryReport{Rank: t.Rank,
		ParamsBytes: u.Peak[tensor.Params], GradsBytes: u.Peak[tensor.Grads],
		OptimBytes: u.Peak[tensor.OptimState], ActPeak: u.Peak[tensor.Activations],
		CommBytes: u.Peak[tensor.Comm], PeakBytes: u.TotalPeak, SavePeakBytes: t.savePeak, LoadPeakBytes: t.loadPeak,
		RSSPeakBytes: RSSPeakBytes()}
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
		if m := GPTConfig(cfg); m.LoRA != nil {
			fmt.Fprintf(log, "tinyacc: LoRA rank %d on %s: %d parameters train, the base is frozen\n",
				m.LoRA.Rank, strings.Join(m.LoRA.Targets, ", "), Numel(m.TrainedShapes()))
		}
		if t.opts.Corpus != "" {
			fmt.Fprintf(log, "tinyacc: data %s; %d training tokens, %d validation\n", t.opts.Corpus, t.Train.Len(), valLen(t))
		}
		global := cfg.Train.BatchSize * cfg.Train.GradAccum * t.DataSize
		fmt.Fprintf(log, "tinyacc: %d steps of %d sequences (%d tokens); ranks %d\n",
			cfg.Train.Steps, global, global*cfg.Model.BlockSize, t.World)
	}
	if cfg.InitFrom != "" {
		mc := GPTConfig(cfg)
		which := fmt.Sprintf("wte, wpe, 12 for each of %d blocks, ln_f", mc.NLayer)
		if mc.Llama != nil {
			which = fmt.Sprintf("embed_tokens, 9 for each of %d layers, norm", mc.NLayer)
			if !mc.Llama.Tied {
				which += ", lm_head"
			}
		}
		fmt.Fprintf(log, "tinyacc: init_from %s: weights only (a fresh schedule, optimizer and data position); loaded %d tensors: %s\n",
			cfg.InitFrom, len(mc.ParamShapes()), which)
	}
	first, err := t.resume(log)
	if err != nil {
		return res, err
	}
	if cfg.Checkpoint.Dir != "" && t.Rank == 0 {
		// A run killed while saving left its partial checkpoint behind.
		removed, err := ckpt.RemovePartialDirs(cfg.Checkpoint.Dir)
		for _, name := range removed {
			fmt.Fprintf(log, "tinyacc: removed %s, a checkpoint an earlier run did not complete\n", filepath.Join(cfg.Checkpoint.Dir, name))
		}
		if err != nil {
			return res, fmt.Errorf("checkpoint.dir: removing an incomplete checkpoint: %w", err)
		}
	}
	if t.metricsPath != "" && t.metrics == nil {
		if t.metrics, err = OpenMetricsWriter(t.metricsPath, first); err != nil {
			return res, err
		}
	}
	evalEvery := cfg.Train.EvalEvery
	logEvery := max(1, cfg.Train.LogEvery)
	lineOpen := false // a live progress line waits for its newline
	saved := -1       // the step of the last checkpoint written
	t.ctx = ctx
	defer func() { t.ctx = nil }()
	for s := first; s < cfg.Train.Steps; s++ {
		// Several ranks stop at the step they agreed on through the last
		// gradient norm; a single process stops as soon as it is asked.
		if (t.world() == nil && ctx.Err() != nil) || t.stopAgreed {
			stop := &Interrupted{Step: s}
			if cfg.Checkpoint.Dir != "" && saved != s && s > first {
				if err := t.checkpoint(log, s, &lineOpen); err != nil {
					return res, err
				}
			}
			if cfg.Checkpoint.Dir != "" && (saved == s || s > first) {
				stop.Checkpoint = filepath.Join(cfg.Checkpoint.Dir, ckpt.StepDir(s))
			}
			return res, stop
		}
		m, err := t.Step(s)
		if err != nil {
			// Named as the progress line names it: the (s+1)-th step.
			return res, fmt.Errorf("step %d: %w", s+1, err)
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
		// Lines for the first step and every log_every-th completed step.
		if lead && (s == first || (s+1)%logEvery == 0 || last) {
			// The ETA extrapolates the mean time of the steps this run has
			// done (evaluations and checkpoints included) to those left.
			done := time.Since(start)
			eta := time.Duration(float64(done) / float64(s+1-first) * float64(cfg.Train.Steps-s-1))
			line := fmt.Sprintf("step %*d/%d  loss %.4f  lr %.2e  %s  %6.0f ms  %7.0f tok/s  mfu %.1f%%  elapsed %s  eta %s",
				len(fmt.Sprint(cfg.Train.Steps)), s+1, cfg.Train.Steps, m.Loss, m.LR, normField(m), m.StepMS, m.TokensPerS, 100*m.MFU,
				clock(done), clock(eta))
			if t.opts.Live {
				fmt.Fprintf(log, "\r%s\x1b[K", line)
				lineOpen = true
			} else {
				fmt.Fprintln(log, line)
			}
		}
		if every := cfg.Checkpoint.Every; cfg.Checkpoint.Dir != "" && every > 0 && (s+1)%every == 0 {
			if err := t.checkpoint(log, s+1, &lineOpen); err != nil {
				return res, err
			}
			saved = s + 1
		}
		if t.Val != nil && ((evalEvery > 0 && (s+1)%evalEvery == 0) || last) {
			vl, err := t.Evaluate()
			if err != nil {
				return res, err
			}
			// Evaluated after s+1 steps: the same number as the train row.
			res.LastEval = EvalPoint{Step: s + 1, Loss: vl}
			if t.opts.OnEval != nil {
				t.opts.OnEval(res.LastEval)
			}
			if t.metrics != nil {
				if err := t.metrics.Write("eval", res.LastEval); err != nil {
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
	if cfg.Checkpoint.Dir != "" && saved != cfg.Train.Steps && first < cfg.Train.Steps {
		if err := t.checkpoint(log, cfg.Train.Steps, &lineOpen); err != nil {
			return res, err
		}
	}
	if cfg.SaveTo != "" {
		if err := t.SaveModel(cfg.SaveTo); err != nil {
			return res, err
		}
		fmt.Fprintf(log, "tinyacc: saved weights to %s\n", cfg.SaveTo)
	}
	if res.Memory, err = t.GatherMemory(); err != nil {
		return res, err
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

// resume loads the checkpoint cfg.Resume names, if any, and returns the
// first step to run.
func (t *Trainer) resume(log io.Writer) (int, error) {
	cfg := t.Cfg
	path := cfg.Resume
	if path == "" {
		return 0, nil
	}
	if path == "auto" {
		dir, err := ckpt.Resolve(cfg.Checkpoint.Dir)
		if err != nil && !errors.Is(err, ckpt.ErrNoCheckpoint) {
			return 0, fmt.Errorf("resume=auto: %w", err)
		}
		if err != nil {
			fmt.Fprintf(log, "tinyacc: resume=auto: no checkpoint in %s yet; starting fresh\n", cfg.Checkpoint.Dir)
			return 0, nil
		}
		path = dir
	}
	dir, err := ckpt.Resolve(path)
	if err != nil {
		return 0, fmt.Errorf("resume: %w", err)
	}
	ix, err := ckpt.ReadIndex(dir)
	if err != nil {
		return 0, fmt.Errorf("resume: %w", err)
	}
	if ix.Step > cfg.Train.Steps {
		return 0, fmt.Errorf("resume: %s completed %d steps, more than train.steps=%d (train.steps is the run's total)", dir, ix.Step, cfg.Train.Steps)
	}
	step, err := t.LoadCheckpoint(dir)
	if err != nil {
		return 0, fmt.Errorf("resume: %w", err)
	}
	fmt.Fprintf(log, "tinyacc: resumed from %s: %d of %d steps done\n", dir, step, cfg.Train.Steps)
	if w := stretchedSchedule(dir, step, t.Sched); w != "" {
		fmt.Fprintln(log, w)
	}
	return step, nil
}

// stretchedSchedule is the warning for a run resumed with another
// train.steps than the checkpoint's run had: a cosine schedule spans
// train.steps, so the learning rate of the remaining steps changes (a
// longer run jumps back up the curve). Extending a run is common, so this
// is said once, and the run continues; "" when nothing changes.
func stretchedSchedule(dir string, step int, now optim.Schedule) string {
	ix, err := ckpt.ReadIndex(dir)
	if err != nil || now.Kind != "cosine" {
		return ""
	}
	old, err := strconv.Atoi(fmt.Sprint(ix.Config["train.steps"]))
	if err != nil || old == now.Steps || step == 0 {
		return ""
	}
	was := now
	was.Steps = old
	return fmt.Sprintf("tinyacc: warning: train.steps is %d here but was %d in the run that wrote %s: the cosine schedule "+
		"(lr %.2e to %.2e after %d warm-up steps) now spans %d steps instead of %d, so step %d's lr is %.2e, not %.2e; continuing",
		now.Steps, old, dir, now.LR, now.MinLR, now.Warmup, now.Steps, old, step+1, now.At(step), was.At(step))
}

// checkpoint writes the state after step steps and says where.
func (t *Trainer) checkpoint(log io.Writer, step int, lineOpen *bool) error {
	start := time.Now()
	dir, err := t.SaveCheckpoint(t.Cfg.Checkpoint.Dir, step)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if *lineOpen {
		fmt.Fprintln(log)
		*lineOpen = false
	}
	fmt.Fprintf(log, "tinyacc: checkpoint %s written in %.2fs\n", dir, time.Since(start).Seconds())
	return nil
}

// clock formats a duration as the log shows it: 42s, 3m05s, 1h02m.
func clock(d time.Duration) string {
	d = d.Round(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
}

func valLen(t *Trainer) int {
	if t.Val == nil {
		return 0
	}
	return t.Val.Len()
}

// WriteMemoryTable prints the per-rank memory table that ends a run. Each
// column is the peak of one allocator category: params the parameters
// (a sharded strategy's shards plus the units it has gathered), grads the
// parameters' gradients (accumulated in place, plus the buffers a
// strategy reduces from), optim the optimizer state, activations what
// forward saves for backward plus the working buffers of one op (never a
// weight-sized temporary), comm the buffers collectives borrow; peak is
// the most of all of them at once, and rss peak the process's VmHWM.
func WriteMemoryTable(w io.Writer, rs []MemoryReport) {
	mib := func(b int64) string { return fmt.Sprintf("%.2f", float64(b)/(1<<20)) }
	ckpt := false
	for _, r := range rs {
		ckpt = ckpt || r.SavePeakBytes > 0 || r.LoadPeakBytes > 0
	}
	head := fmt.Sprintf("memory (MiB)  %6s %10s %10s %10s %12s %10s %10s %10s", "rank", "params", "grads", "optim", "activations", "comm", "peak", "rss peak")
	if ckpt {
		head += fmt.Sprintf(" %10s %10s", "ckpt save", "ckpt load")
	}
	fmt.Fprintln(w, head)
	for _, r := range rs {
		line := fmt.Sprintf("              %6d %10s %10s %10s %12s %10s %10s %10s", r.Rank, mib(r.ParamsBytes), mib(r.GradsBytes),
			mib(r.OptimBytes), mib(r.ActPeak), mib(r.CommBytes), mib(r.PeakBytes), mib(r.RSSPeakBytes))
		if ckpt {
			line += fmt.Sprintf(" %10s %10s", mib(r.SavePeakBytes), mib(r.LoadPeakBytes))
		}
		fmt.Fprintln(w, line)
	}
}

// GatherMemory returns every rank's memory report, in rank order (one
// all-gather over the world), amended by the MemoryGatherer plugins.
func (t *Trainer) GatherMemory() ([]MemoryReport, error) {
	mine := t.Memory()
	all := []MemoryReport{mine}
	if w := t.world(); w != nil {
		const fields = 10
		in := tensor.FromF64([]float64{float64(mine.Rank), float64(mine.ParamsBytes), float64(mine.GradsBytes),
			float64(mine.OptimBytes), float64(mine.ActPeak), float64(mine.CommBytes), float64(mine.PeakBytes),
			float64(mine.SavePeakBytes), float64(mine.LoadPeakBytes), float64(mine.RSSPeakBytes)}, fields)
		n := w.Size()
		out := tensor.FromF64(make([]float64, n*fields), n*fields)
		// Byte counts travel as float64, exact up to 2^53 bytes.
		span := t.Trace.Begin("all_gather memory", "comm", trace.Comm).With("bytes", out.Bytes())
		err := w.AllGather(in, out)
		span.End()
		if err != nil {
			return nil, fmt.Errorf("trainer: gathering memory reports over the world: %w", err)
		}
		all = make([]MemoryReport, n)
		for r := range all {
			f := out.F64()[r*fields : (r+1)*fields]
			all[r] = MemoryReport{Rank: int(f[0]), ParamsBytes: int64(f[1]), GradsBytes: int64(f[2]),
				OptimBytes: int64(f[3]), ActPeak: int64(f[4]), CommBytes: int64(f[5]), PeakBytes: int64(f[6]),
				SavePeakBytes: int64(f[7]), LoadPeakBytes: int64(f[8]), RSSPeakBytes: int64(f[9])}
		}
	}
	for _, p := range t.Plugins {
		if g, ok := p.(MemoryGatherer); ok {
			var err error
			if all, err = g.GatherMemory(t, all); err != nil {
				return nil, fmt.Errorf("trainer: %s memory reports: %w", p.Name(), err)
			}
		}
	}
	return all, nil
}

// normField is the progress line's gradient norm. A step whose update was
// dropped says so instead of a number that reads like a healthy step: the
// trainer's own skip (train.nonfinite=skip) shows the non-finite norm, and
// a step whose gradients a plugin zeroed (a guard's skip) has norm 0, which
// no step that learned from its data has.
func normField(m StepMetrics) string {
	switch {
	case m.Skipped:
		return fmt.Sprintf("norm %v (skipped)", m.GradNorm)
	case m.GradNorm == 0:
		return "norm 0 (every gradient zero: skipped)"
	}
	return fmt.Sprintf("norm %.3f", m.GradNorm)
}
