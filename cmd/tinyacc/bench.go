package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// benchShape is the GPT both sides of `bench step` train.
// Arch "llama" trains a Llama of KV key/value heads (0: NHead) and SwiGLU
// width FFN (0: the model.intermediate_size default).
type benchShape struct {
	NLayer, NHead, NEmbd, Block, Vocab, Batch int
	Arch                                      string
	KV, FFN                                   int
}

func (s benchShape) args() []string {
	a := []string{"--n_layer", strconv.Itoa(s.NLayer), "--n_head", strconv.Itoa(s.NHead), "--n_embd", strconv.Itoa(s.NEmbd),
		"--block_size", strconv.Itoa(s.Block), "--vocab_size", strconv.Itoa(s.Vocab), "--batch", strconv.Itoa(s.Batch)}
	if s.Arch == "llama" {
		c := s.config()
		a = append(a, "--arch", "llama", "--n_kv_head", strconv.Itoa(c.KVHeads()), "--intermediate_size", strconv.Itoa(c.FFNWidth()))
	}
	return a
}

// config is the run configuration of the bench model.
func (s benchShape) config() config.Config {
	cfg := config.Defaults()
	cfg.Model.NLayer, cfg.Model.NHead, cfg.Model.NEmbd = s.NLayer, s.NHead, s.NEmbd
	cfg.Model.BlockSize, cfg.Model.VocabSize = s.Block, s.Vocab
	if s.Arch == "llama" {
		cfg.Model.Arch, cfg.Model.NKVHead, cfg.Model.IntermediateSize = "llama", s.KV, s.FFN
	}
	return cfg
}

// benchStep times training steps of the same GPT in tinyacc (in this
// process) and in PyTorch (bench/torch_step.py), for each thread count,
// interleaving the two so machine noise hits both alike.
func benchStep(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench step", flag.ContinueOnError)
	steps := fs.Int("steps", 10, "timed steps per run")
	warmup := fs.Int("warmup", 2, "untimed steps before timing")
	repeats := fs.Int("repeats", 3, "interleaved runs of each side per thread count")
	threadsFlag := fs.String("threads", "1,2", "thread counts to compare")
	script := fs.String("torch-script", "bench/torch_step.py", "the PyTorch side")
	python := fs.String("python", "/usr/bin/python3", "Python with torch")
	asJSON := fs.Bool("json", false, "print one JSON object per thread count and precision")
	precFlag := fs.String("precision", "fp32,bf16", "precisions to compare: fp32 (train.mixed_precision=no), bf16 (the engine's bf16 against PyTorch autocast bf16), bf16-portable (bf16 on the portable path, as TINYACC_BF16_KERNEL=off runs it) and fp16 (no PyTorch peer: its CPU autocast is bf16 only)")
	var s benchShape
	fs.IntVar(&s.NLayer, "n_layer", 4, "")
	fs.IntVar(&s.NHead, "n_head", 4, "")
	fs.IntVar(&s.NEmbd, "n_embd", 256, "")
	fs.IntVar(&s.Block, "block_size", 256, "")
	fs.IntVar(&s.Vocab, "vocab_size", 256, "")
	fs.IntVar(&s.Batch, "batch", 8, "")
	fs.StringVar(&s.Arch, "model.arch", "gpt2", "gpt2 or llama (both sides)")
	fs.IntVar(&s.KV, "n_kv_head", 0, "llama: key/value heads (0: n_head)")
	fs.IntVar(&s.FFN, "intermediate_size", 0, "llama: SwiGLU width (0: 8/3 n_embd rounded up to 64)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if c := s.config(); c.Validate() != nil {
		return fmt.Errorf("bench step: %w", c.Validate())
	}
	var threads []int
	for _, f := range strings.Split(*threadsFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("bench step: --threads %q: want a list of positive counts like 1,2", *threadsFlag)
		}
		threads = append(threads, n)
	}
	var precs []string
	for _, p := range strings.Split(*precFlag, ",") {
		p = strings.TrimSpace(p)
		if !slices.Contains(benchPrecisions, p) {
			return fmt.Errorf("bench step: --precision %q: want a list of %s", *precFlag, strings.Join(benchPrecisions, ", "))
		}
		precs = append(precs, p)
	}
	if _, err := os.Stat(*script); err != nil {
		return fmt.Errorf("bench step: PyTorch side %s not found (run from the repository root or give --torch-script): %v", *script, err)
	}
	what := "GPT-2"
	if c := s.config(); s.Arch == "llama" {
		what = fmt.Sprintf("Llama (n_kv_head %d, intermediate_size %d)", c.KVHeads(), c.FFNWidth())
	}
	fmt.Fprintf(stderr, "bench step: %s n_layer %d n_head %d n_embd %d block %d vocab %d batch %d; %d steps x %d repeats; blas %s, bf16 products %s, bf16-portable and fp16 products float32 %s\n",
		what, s.NLayer, s.NHead, s.NEmbd, s.Block, s.Vocab, s.Batch, *steps, *repeats, cpu.BLASName(), cpu.HalfGemmPath(), cpu.BLASName())
	type row struct {
		Threads   int     `json:"threads"`
		Precision string  `json:"precision"`
		TinyaccMS float64 `json:"tinyacc_ms"`
		TorchMS   float64 `json:"pytorch_ms"` // 0 where PyTorch has no peer (fp16)
		TokensPS  float64 `json:"tinyacc_tokens_per_s"`
		Ratio     float64 `json:"ratio_vs_best_pytorch"` // against PyTorch's best thread count in the same precision; 0 without a peer
	}
	// The precisions run in turn within each repeat, each beside its
	// PyTorch peer, so a drift in the machine's load falls on every
	// precision alike; bf16 and bf16-portable share one autocast run per
	// repeat.
	var rows []row
	var byRun []string // the run-by-run ratios against fp32, printed last
	for _, th := range threads {
		ours, theirs := map[string][]float64{}, map[string][]float64{}
		for r := 0; r < *repeats; r++ {
			peer := map[string]float64{} // this repeat's PyTorch runs, by peer
			for _, prec := range precs {
				ms, err := tinyaccStepMS(s, prec, th, *warmup, *steps)
				if err != nil {
					return err
				}
				ours[prec] = append(ours[prec], ms)
				name := torchPeer(prec)
				if name == "" {
					fmt.Fprintf(stderr, "  threads %d %s run %d: tinyacc %.1f ms/step\n", th, prec, r+1, ms)
					continue
				}
				tms, ok := peer[name]
				if !ok {
					if tms, err = torchStepMS(*python, *script, s, prec, th, *warmup, *steps); err != nil {
						return err
					}
					peer[name] = tms
				}
				theirs[prec] = append(theirs[prec], tms)
				fmt.Fprintf(stderr, "  threads %d %s run %d: tinyacc %.1f ms/step, %s %.1f ms/step\n", th, prec, r+1, ms, name, tms)
			}
		}
		for _, prec := range precs {
			ms, tms := median(ours[prec]), 0.0
			if len(theirs[prec]) > 0 {
				tms = median(theirs[prec])
			}
			rows = append(rows, row{Threads: th, Precision: prec, TinyaccMS: ms, TorchMS: tms,
				TokensPS: float64(s.Batch*s.Block) / (ms / 1000)})
		}
		// Run by run against fp32: each repeat's two runs came one after
		// the other, so their ratio is steadier than that of the medians.
		if f := ours["fp32"]; f != nil {
			for _, prec := range precs {
				if prec == "fp32" {
					continue
				}
				var ratios []float64
				var txt []string
				for r, ms := range ours[prec] {
					ratios = append(ratios, f[r]/ms)
					txt = append(txt, fmt.Sprintf("%.2f", f[r]/ms))
				}
				byRun = append(byRun, fmt.Sprintf("tinyacc %s vs fp32 (%d threads), run by run: %s tokens/s, median %.2fx", prec, th, strings.Join(txt, ", "), median(ratios)))
			}
		}
	}
	best := func(prec string, torch bool) row {
		var b row
		for _, r := range rows {
			v, bv := r.TinyaccMS, b.TinyaccMS
			if torch {
				v, bv = r.TorchMS, b.TorchMS
			}
			if r.Precision == prec && (b.Threads == 0 || v < bv) {
				b = r
			}
		}
		return b
	}
	for i := range rows {
		if t := best(rows[i].Precision, true).TorchMS; t > 0 {
			rows[i].Ratio = rows[i].TinyaccMS / t
		}
	}
	if *asJSON {
		return writeJSONLines(stdout, rows)
	}
	fmt.Fprintf(stdout, "%8s %13s %16s %16s %18s %22s\n", "threads", "precision", "tinyacc ms/step", "pytorch ms/step", "tinyacc tokens/s", "tinyacc/best pytorch")
	for _, r := range rows {
		torch, ratio := "-", "-"
		if r.TorchMS > 0 {
			torch, ratio = fmt.Sprintf("%.1f", r.TorchMS), fmt.Sprintf("%.3f", r.Ratio)
		}
		fmt.Fprintf(stdout, "%8d %13s %16.1f %16s %18.0f %22s\n", r.Threads, r.Precision, r.TinyaccMS, torch, r.TokensPS, ratio)
	}
	for _, prec := range precs {
		o, t := best(prec, false), best(prec, true)
		if torchPeer(prec) == "" {
			fmt.Fprintf(stdout, "%s: best tinyacc (%d threads) %.1f ms; no PyTorch peer (torch's CPU autocast is bf16 only)\n", prec, o.Threads, o.TinyaccMS)
			continue
		}
		fmt.Fprintf(stdout, "%s: best tinyacc (%d threads) %.1f ms vs best %s (%d threads) %.1f ms: ratio %.3f\n",
			prec, o.Threads, o.TinyaccMS, torchPeer(prec), t.Threads, t.TorchMS, o.TinyaccMS/t.TorchMS)
	}
	if slices.Contains(precs, "fp32") {
		f := best("fp32", false)
		for _, prec := range precs {
			if prec != "fp32" {
				b := best(prec, false)
				fmt.Fprintf(stdout, "tinyacc %s vs fp32 (best of each): %.0f vs %.0f tokens/s, %.2fx\n", prec, b.TokensPS, f.TokensPS, b.TokensPS/f.TokensPS)
			}
		}
	}
	for _, l := range byRun {
		fmt.Fprintln(stdout, l)
	}
	return nil
}

// benchPrecisions are bench step's precisions: fp32, the engine's bf16
// (on the AVX512-BF16 kernel where the CPU has it), bf16 on the portable
// path every other CPU takes (the kernel turned off for the run, as
// TINYACC_BF16_KERNEL=off does), and fp16, which always takes it.
var benchPrecisions = []string{"fp32", "bf16", "bf16-portable", "fp16"}

// torchPeer names the PyTorch run a precision is compared with: "" for
// fp16, since torch's CPU autocast is bf16 only.
func torchPeer(prec string) string {
	switch prec {
	case "fp32":
		return "pytorch"
	case "bf16", "bf16-portable":
		return "pytorch autocast bf16"
	}
	return ""
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// tinyaccStepMS trains the bench GPT on random tokens with the given thread
// count and returns the median step time.
func tinyaccStepMS(s benchShape, prec string, threads, warmup, steps int) (float64, error) {
	prevProcs := runtime.GOMAXPROCS(threads)
	prevThreads := cpu.Threads()
	cpu.SetThreads(threads)
	defer func() { runtime.GOMAXPROCS(prevProcs); cpu.SetThreads(prevThreads) }()

	cfg := s.config()
	cfg.Train.BatchSize, cfg.Train.Steps = s.Batch, warmup+steps
	cfg.Train.Schedule = "constant"
	cfg.Train.GradClip = 0
	cfg.Data.Order = "random"
	switch prec {
	case "bf16", "fp16":
		cfg.Train.MixedPrecision = prec
	case "bf16-portable":
		cfg.Train.MixedPrecision = "bf16"
		defer cpu.SetBF16Kernel(cpu.SetBF16Kernel(false)) // off for this run, then as it was
	}
	r := nn.NewRand(1, "bench-tokens")
	tokens := make([]int32, 1<<20)
	for i := range tokens {
		tokens[i] = int32(r.Uint64() % uint64(s.Vocab))
	}
	t, err := trainer.New(cfg, trainer.Options{Train: tokens})
	if err != nil {
		return 0, err
	}
	var times []float64
	for i := 0; i < warmup+steps; i++ {
		start := time.Now()
		if _, err := t.Step(i); err != nil {
			return 0, err
		}
		if i >= warmup {
			times = append(times, float64(time.Since(start).Microseconds())/1000)
		}
	}
	return median(times), nil
}

func torchStepMS(python, script string, s benchShape, prec string, threads, warmup, steps int) (float64, error) {
	args := append([]string{script}, s.args()...)
	args = append(args, "--steps", strconv.Itoa(steps), "--warmup", strconv.Itoa(warmup), "--threads", strconv.Itoa(threads))
	if prec == "bf16" || prec == "bf16-portable" {
		args = append(args, "--autocast", "bf16")
	}
	cmd := exec.Command(python, args...)
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS="+strconv.Itoa(threads))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("bench step: %s %s: %v\n%s", python, filepath.Base(script), err, errb.String())
	}
	var res struct {
		MS float64 `json:"ms_per_step"`
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		return 0, fmt.Errorf("bench step: reading %s output %q: %v", script, out.String(), err)
	}
	return res.MS, nil
}

// benchFiles is where a benchmark keeps its runs' metrics and traces, and
// the binary it starts them with: keep when given, else a temporary
// directory that done removes.
func benchFiles(keep, name string) (dir, exe string, done func(), err error) {
	if exe, err = os.Executable(); err != nil {
		return "", "", nil, err
	}
	if keep != "" {
		return keep, exe, func() {}, nil
	}
	if dir, err = os.MkdirTemp("", "tinyacc-bench-"+name); err != nil {
		return "", "", nil, err
	}
	return dir, exe, func() { os.RemoveAll(dir) }, nil
}

// gptFlags registers a benchmark's model-shape flags on m, def giving
// their defaults.
func gptFlags(fs *flag.FlagSet, m *nn.GPTConfig, def nn.GPTConfig) {
	fs.IntVar(&m.NLayer, "n_layer", def.NLayer, "")
	fs.IntVar(&m.NHead, "n_head", def.NHead, "")
	fs.IntVar(&m.NEmbd, "n_embd", def.NEmbd, "")
	fs.IntVar(&m.BlockSize, "block_size", def.BlockSize, "")
	fs.IntVar(&m.VocabSize, "vocab_size", def.VocabSize, "")
}

// writeJSONLines writes each of rows as one JSON object a line: the
// --json form of the bench, estimate and plan tables.
func writeJSONLines[T any](w io.Writer, rows []T) error {
	enc := json.NewEncoder(w)
	for _, r := range rows {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}
