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
	precFlag := fs.String("precision", "fp32,bf16", "precisions to compare: fp32 (train.mixed_precision=no) and bf16 (the engine's bf16 against PyTorch autocast bf16)")
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
		if p != "fp32" && p != "bf16" {
			return fmt.Errorf("bench step: --precision %q: want a list of fp32 and bf16", *precFlag)
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
	fmt.Fprintf(stderr, "bench step: %s n_layer %d n_head %d n_embd %d block %d vocab %d batch %d; %d steps x %d repeats; blas %s, bf16 products %s\n",
		what, s.NLayer, s.NHead, s.NEmbd, s.Block, s.Vocab, s.Batch, *steps, *repeats, cpu.BLASName(), cpu.HalfGemmPath())
	type row struct {
		Threads   int     `json:"threads"`
		Precision string  `json:"precision"`
		TinyaccMS float64 `json:"tinyacc_ms"`
		TorchMS   float64 `json:"pytorch_ms"`
		TokensPS  float64 `json:"tinyacc_tokens_per_s"`
		Ratio     float64 `json:"ratio_vs_best_pytorch"` // against PyTorch's best thread count in the same precision
	}
	var rows []row
	for _, th := range threads {
		for _, prec := range precs {
			var ours, theirs []float64
			for r := 0; r < *repeats; r++ {
				ms, err := tinyaccStepMS(s, prec, th, *warmup, *steps)
				if err != nil {
					return err
				}
				ours = append(ours, ms)
				tms, err := torchStepMS(*python, *script, s, prec, th, *warmup, *steps)
				if err != nil {
					return err
				}
				theirs = append(theirs, tms)
				fmt.Fprintf(stderr, "  threads %d %s run %d: tinyacc %.1f ms/step, pytorch %.1f ms/step\n", th, prec, r+1, ms, tms)
			}
			ms := median(ours)
			rows = append(rows, row{Threads: th, Precision: prec, TinyaccMS: ms, TorchMS: median(theirs),
				TokensPS: float64(s.Batch*s.Block) / (ms / 1000)})
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
		rows[i].Ratio = rows[i].TinyaccMS / best(rows[i].Precision, true).TorchMS
	}
	if *asJSON {
		return writeJSONLines(stdout, rows)
	}
	fmt.Fprintf(stdout, "%8s %10s %16s %16s %18s %22s\n", "threads", "precision", "tinyacc ms/step", "pytorch ms/step", "tinyacc tokens/s", "tinyacc/best pytorch")
	for _, r := range rows {
		fmt.Fprintf(stdout, "%8d %10s %16.1f %16.1f %18.0f %22.3f\n", r.Threads, r.Precision, r.TinyaccMS, r.TorchMS, r.TokensPS, r.Ratio)
	}
	for _, prec := range precs {
		o, t := best(prec, false), best(prec, true)
		peer := "pytorch"
		if prec == "bf16" {
			peer = "pytorch autocast bf16"
		}
		fmt.Fprintf(stdout, "%s: best tinyacc (%d threads) %.1f ms vs best %s (%d threads) %.1f ms: ratio %.3f\n",
			prec, o.Threads, o.TinyaccMS, peer, t.Threads, t.TorchMS, o.TinyaccMS/t.TorchMS)
	}
	if len(precs) == 2 {
		f, b := best("fp32", false), best("bf16", false)
		fmt.Fprintf(stdout, "tinyacc bf16 vs fp32 (best of each): %.0f vs %.0f tokens/s, %.2fx\n", b.TokensPS, f.TokensPS, b.TokensPS/f.TokensPS)
	}
	return nil
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
	if prec == "bf16" {
		cfg.Train.MixedPrecision = "bf16"
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
	if prec == "bf16" {
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
