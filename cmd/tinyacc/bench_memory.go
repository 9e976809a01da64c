package main

import (
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins"
)

// memoryRow is one layout of `bench memory`. flags may hold %d, the
// --nproc N of the bench; a row with no flags runs one process. formula
// is the Playbook's bytes per rank with AdamW given the bytes p of a
// parameter (4 in fp32; 2 for the half copy + 4 for the float32 master
// under bf16/fp16), 4 of gradient and 8 of moments per parameter the
// rank holds.
type memoryRow struct {
	name, flags string
	formula     func(m nn.GPTConfig, n int, p float64) float64
}

var memoryRows = []memoryRow{
	{"1 process", "", func(m nn.GPTConfig, _ int, p float64) float64 { return (p + 12) * float64(m.NumParams()) }},
	// ZeRO-3 shards everything; under bf16/fp16 the 2-byte copies exist
	// only while their unit is gathered (working set), so the float32
	// masters' 4 bytes are the parameter's sharded share in either
	// precision.
	{"zero-3 dp %d", "--parallel.dp=%d --zero.stage=3", func(m nn.GPTConfig, n int, p float64) float64 {
		return 16 * float64(m.NumParams()) / float64(n)
	}},
	{"tp %d", "--parallel.tp=%d", tpFormulaBytes},
	{"pp %d 1f1b", "--parallel.pp=%d --pp.schedule=1f1b --train.grad_accum=%d", func(m nn.GPTConfig, n int, p float64) float64 {
		return (p + 12) * float64(m.NumParams()) / float64(n)
	}},
	// ZeRO-1 shards the optimizer state: in fp32 the moments, under
	// bf16/fp16 the float32 masters with them (p - 4 = 2 bytes of copy
	// stay whole); the gradients stay whole.
	{"zero-1 dp %d", "--parallel.dp=%d --zero.stage=1", func(m nn.GPTConfig, n int, p float64) float64 {
		if p == 4 {
			return (4 + 4 + 8/float64(n)) * float64(m.NumParams())
		}
		return (p - 4 + 4 + 12/float64(n)) * float64(m.NumParams())
	}},
}

// precisionParamBytes is the p of the formulas: the bytes a parameter
// takes in train.mixed_precision mp.
func precisionParamBytes(mp string) float64 {
	if mp == "no" {
		return 4
	}
	return 2 + 4
}

// tpFormulaBytes is the Playbook's tensor-parallel share: Ψ/t of every
// parameter except the norms (GPT-2's LayerNorms, a Llama's RMSNorms),
// which every rank keeps whole.
func tpFormulaBytes(m nn.GPTConfig, t int, p float64) float64 {
	var ln, rest float64
	for _, p := range m.ParamShapes() {
		n := 1.0
		for _, d := range p.Shape {
			n *= float64(d)
		}
		if strings.Contains(p.Name, "ln_") || strings.HasSuffix(p.Name, "layernorm.weight") || p.Name == nn.LlamaNormName {
			ln += n
		} else {
			rest += n
		}
	}
	return (p + 12) * (rest/float64(t) + ln)
}

// modelName says which model the bench trains: GPT (GPT-2) or a Llama
// with its key/value heads and SwiGLU width.
func modelName(m nn.GPTConfig) string {
	if m.Llama == nil {
		return "GPT"
	}
	return fmt.Sprintf("Llama (n_kv_head %d, intermediate_size %d)", m.Llama.NKVHead, m.Llama.Intermediate)
}

// memoryResult is one rank of one layout: what `bench memory` prints.
type memoryResult struct {
	Layout string `json:"layout"`
	// Precision is the run's train.mixed_precision (no: float32).
	Precision string `json:"mixed_precision"`
	Rank      int    `json:"rank"`
	VmHWM     int64  `json:"rss_peak_bytes"`
	Est       int64  `json:"estimate_bytes"`
	Formula   int64  `json:"formula_bytes"`
	// Buffers is what the estimate states beyond the formula for
	// training: activations, gathered units and padding, communication
	// buffers, the data, the shared-memory rings and the runtime (the
	// estimate less its set-up excess, less the formula).
	Buffers int64 `json:"buffers_bytes"`
	// Single is the resident peak of one process training the same
	// global batch (train.batch_size × dp, same micro-batches).
	Single       int64   `json:"one_process_rss_peak_bytes"`
	VsSingle     float64 `json:"rss_over_one_process"`
	VsFormula    float64 `json:"rss_over_formula_and_buffers"`
	VsEstimate   float64 `json:"rss_over_estimate"`
	AllocPeak    int64   `json:"alloc_peak_bytes"`
	ActPeakBytes int64   `json:"activations_peak_bytes"`
	// The allocator's columns measured and estimated: the parameters
	// (half copies under bf16/fp16), the optimizer state (with the
	// float32 masters under bf16/fp16) and the training peak.
	ParamsBytes    int64 `json:"params_bytes"`
	EstParamsBytes int64 `json:"estimate_params_bytes"`
	OptimBytes     int64 `json:"optim_bytes"`
	EstOptimBytes  int64 `json:"estimate_optim_bytes"`
	EstAllocPeak   int64 `json:"estimate_alloc_peak_bytes"`
	// The activations' peak the estimate states (2-byte activations
	// under bf16/fp16), beside the measured ActPeakBytes.
	EstActPeakBytes int64 `json:"estimate_activations_peak_bytes"`
}

// memoryJob is one layout in one precision.
type memoryJob struct {
	row memoryRow
	mp  string
}

// jobs lists each row in each precision, a row's precisions together so
// the table shows them side by side.
func jobs(rows []memoryRow, precs []string) []memoryJob {
	var out []memoryJob
	for _, r := range rows {
		for _, mp := range precs {
			out = append(out, memoryJob{r, mp})
		}
	}
	return out
}

// benchMemory runs one real training step of one model per layout of
// memoryRows, each as its own job of `tinyacc train` processes, and
// prints per rank the resident peak the kernel measured (VmHWM), the
// estimate `train` checks memory.limit against, the Playbook formula and
// the buffers the estimate states beside it, and the resident peak of one
// process training the same global batch, with the ratios. Every rank
// trains batch sequences per micro-batch.
func benchMemory(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench memory", flag.ContinueOnError)
	nproc := fs.Int("nproc", 4, "ranks of the parallel layouts")
	batch := fs.Int("batch", 1, "sequences per rank and micro-batch")
	rowsFlag := fs.String("layouts", "", "comma-separated row numbers to run (0 = 1 process, 1 = zero-3, 2 = tp, 3 = pp, 4 = zero-1); default all")
	precFlag := fs.String("precision", "no", "comma-separated train.mixed_precision values to run each layout in (no, bf16, fp16), e.g. no,bf16")
	asJSON := fs.Bool("json", false, "print one JSON object per rank and layout")
	keep := fs.String("keep", "", "directory to keep the runs' metrics in (default: a temporary one)")
	arch := fs.String("model.arch", "gpt2", "gpt2 or llama")
	kv := fs.Int("n_kv_head", 0, "llama: key/value heads (0: n_head)")
	ffn := fs.Int("intermediate_size", 0, "llama: SwiGLU width (0: 8/3 n_embd rounded up to 64)")
	var m nn.GPTConfig
	gptFlags(fs, &m, nn.GPTConfig{NLayer: 24, NHead: 16, NEmbd: 1024, BlockSize: 64, VocabSize: 50257})
	if err := fs.Parse(args); err != nil {
		return err
	}
	// modelFlags are the model keys every run of the bench takes beside
	// the shape; m is the model they and the shape make.
	var modelFlags []string
	switch {
	case *arch == "llama":
		modelFlags = []string{"--model.arch=llama", "--model.n_kv_head=" + strconv.Itoa(*kv), "--model.intermediate_size=" + strconv.Itoa(*ffn)}
	case *arch != "gpt2":
		return fmt.Errorf("bench memory: --model.arch %q: want gpt2 or llama", *arch)
	case *kv != 0 || *ffn != 0:
		return fmt.Errorf("bench memory: --n_kv_head and --intermediate_size shape a Llama: add --model.arch llama")
	}
	mc, err := config.Load("", nil, append(trainArgs("", m, 1, 1)[2:], modelFlags...))
	if err != nil {
		return fmt.Errorf("bench memory: %w", err)
	}
	m = trainer.GPTConfig(mc.Config)
	if err := m.Validate(); err != nil {
		return fmt.Errorf("bench memory: %w", err)
	}
	n := *nproc
	if n < 2 || *batch < 1 {
		return fmt.Errorf("bench memory: --nproc %d --batch %d: the parallel layouts need 2 or more ranks and 1 or more sequences", n, *batch)
	}
	rows := memoryRows
	if *rowsFlag != "" {
		rows = nil
		for _, f := range strings.Split(*rowsFlag, ",") {
			i, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || i < 0 || i >= len(memoryRows) {
				return fmt.Errorf("bench memory: --layouts %q: want row numbers from 0 to %d", *rowsFlag, len(memoryRows)-1)
			}
			rows = append(rows, memoryRows[i])
		}
	}
	var precs []string
	for _, f := range strings.Split(*precFlag, ",") {
		f = strings.TrimSpace(f)
		if f != "no" && f != "bf16" && f != "fp16" {
			return fmt.Errorf("bench memory: --precision %q: want no, bf16 or fp16, comma-separated", *precFlag)
		}
		precs = append(precs, f)
	}
	dir, exe, done, err := benchFiles(*keep, "memory")
	if err != nil {
		return err
	}
	defer done()
	fmt.Fprintf(stderr, "bench memory: %s n_layer %d n_head %d n_embd %d context %d vocab %d: Ψ = %.2fM parameters; %d sequence(s) per rank\n",
		modelName(m), m.NLayer, m.NHead, m.NEmbd, m.BlockSize, m.VocabSize, float64(m.NumParams())/1e6, *batch)
	// run trains one step of flags on procs processes, b sequences per
	// rank and micro-batch, and returns its config and every rank's
	// memory line.
	run := func(tag string, procs, b int, flags []string) (config.Config, []metricLine, error) {
		metrics := filepath.Join(dir, tag+".jsonl")
		argv := append(trainArgs(exe, m, b, 1, flags...), "--metrics_file="+metrics)
		r, err := config.Load("", nil, argv[2:])
		if err != nil {
			return config.Config{}, nil, fmt.Errorf("bench memory %s: %w", tag, err)
		}
		if err := launchTrain("memory", tag, procs, argv, stderr); err != nil {
			return config.Config{}, nil, err
		}
		lines, err := readMetrics(metrics)
		if err != nil {
			return config.Config{}, nil, err
		}
		mem := make([]metricLine, procs)
		seen := 0
		for _, l := range lines {
			if l.Kind == "memory" && l.Rank >= 0 && l.Rank < procs {
				mem[l.Rank] = l
				seen++
			}
		}
		if seen != procs {
			return config.Config{}, nil, fmt.Errorf("bench memory %s: %s has %d memory lines for %d ranks", tag, metrics, seen, procs)
		}
		return r.Config, mem, nil
	}
	nd := strings.NewReplacer("%d", strconv.Itoa(n))
	// jobFlags are a job's layout name, process count and train flags.
	jobFlags := func(job memoryJob) (string, int, []string) {
		name, procs := nd.Replace(job.row.name), 1
		flags := append([]string{"--train.schedule=constant", "--train.mixed_precision=" + job.mp}, modelFlags...)
		if job.row.flags != "" {
			procs = n
			flags = append(flags, strings.Fields(nd.Replace(job.row.flags))...)
		}
		return name, procs, flags
	}
	// Every layout's config is loaded before any runs: a layout the model
	// does not fit (n_kv_head under tp) fails at once, not after the
	// layouts before it.
	todo := jobs(rows, precs)
	loaded := make([]config.Config, len(todo))
	for i, job := range todo {
		name, _, flags := jobFlags(job)
		c, err := config.Load("", nil, trainArgs("", m, *batch, 1, flags...)[2:])
		if err != nil {
			return fmt.Errorf("bench memory: row %q: %w", name, err)
		}
		loaded[i] = c.Config
	}
	singles := map[string]int64{} // one process's VmHWM by its flags
	var out []memoryResult
	for i, job := range todo {
		mp := job.mp
		name, procs, flags := jobFlags(job)
		p := loaded[i].Parallel
		dp := procs / max(1, p.TP*p.PP*p.CP)
		tag := strings.NewReplacer(" ", "", "-", "").Replace(name) + "-" + mp
		cfg, mem, err := run(tag, procs, *batch, flags)
		if err != nil {
			return err
		}
		es, err := plugins.EstimateProcesses(cfg, procs, procs)
		if err != nil {
			return fmt.Errorf("bench memory: row %q: %w", name, err)
		}
		// The peer: one process on the same global batch, the same
		// micro-batches.
		peer := append([]string{"--train.schedule=constant", "--train.mixed_precision=" + mp, "--train.grad_accum=" + strconv.Itoa(cfg.Train.GradAccum)}, modelFlags...)
		key := fmt.Sprintf("b%d-a%d-%s", *batch*dp, cfg.Train.GradAccum, mp)
		if _, ok := singles[key]; !ok {
			if procs == 1 {
				singles[key] = int64(mem[0].RSS)
			} else {
				_, one, err := run("single-"+key, 1, *batch*dp, peer)
				if err != nil {
					return err
				}
				singles[key] = int64(one[0].RSS)
			}
		}
		single := singles[key]
		formula := int64(job.row.formula(m, procs, precisionParamBytes(mp)))
		for r, l := range mem {
			e := es[r]
			trained := e.ProcessBytes() - e.SetupPeakBytes
			res := memoryResult{Layout: name, Precision: mp, Rank: r, VmHWM: int64(l.RSS), Est: e.ProcessBytes(), Formula: formula,
				Buffers: trained - formula, Single: single, AllocPeak: int64(l.Peak), ActPeakBytes: int64(l.Act),
				ParamsBytes: int64(l.Params), EstParamsBytes: e.ParamsBytes, OptimBytes: int64(l.Optim), EstOptimBytes: e.OptimBytes, EstAllocPeak: e.PeakBytes,
				EstActPeakBytes: e.ActPeak}
			res.VsSingle = float64(res.VmHWM) / float64(single)
			res.VsFormula = float64(res.VmHWM) / float64(trained)
			res.VsEstimate = float64(res.VmHWM) / float64(res.Est)
			out = append(out, res)
		}
	}
	if *asJSON {
		return writeJSONLines(stdout, out)
	}
	mib := func(b int64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }
	fmt.Fprintf(stdout, "%s n_layer %d n_head %d n_embd %d context %d vocab %d: Ψ = %.2fM parameters; %d sequence(s) per rank; one training step per layout\n",
		modelName(m), m.NLayer, m.NHead, m.NEmbd, m.BlockSize, m.VocabSize, float64(m.NumParams())/1e6, *batch)
	fmt.Fprintf(stdout, "%-14s %4s %4s %10s %10s %10s %10s %10s %10s %9s %9s %9s %15s %15s %15s %15s\n", "layout", "prec", "rank", "VmHWM MiB", "alloc MiB", "est MiB", "formula", "+buffers", "1 proc", "/1 proc", "/f+buf", "/est",
		"params/est", "optim/est", "act/est", "alloc/est")
	for _, r := range out {
		fmt.Fprintf(stdout, "%-14s %4s %4d %10s %10s %10s %10s %10s %10s %8.3fx %8.3fx %8.3fx %15s %15s %15s %15s\n", r.Layout, r.Precision, r.Rank, mib(r.VmHWM), mib(r.AllocPeak), mib(r.Est),
			mib(r.Formula), mib(r.Formula+r.Buffers), mib(r.Single), r.VsSingle, r.VsFormula, r.VsEstimate,
			mib(r.ParamsBytes)+"/"+mib(r.EstParamsBytes), mib(r.OptimBytes)+"/"+mib(r.EstOptimBytes), mib(r.ActPeakBytes)+"/"+mib(r.EstActPeakBytes), mib(r.AllocPeak)+"/"+mib(r.EstAllocPeak))
	}
	fmt.Fprintln(stdout, "VmHWM: the rank's resident peak (rss_peak_bytes); alloc: its allocator's peak; est: `tinyacc estimate` (set-up, data and runtime included)")
	fmt.Fprintln(stdout, "formula: (p+4+8)·Ψ per rank's share (Ψ/N for ZeRO-3 and pp, Ψ/t for tp but the norms, for ZeRO-1 the moments /N, and under bf16/fp16 the masters with them), p = 4 in fp32 (prec no), 2+4 (copy + master) in bf16/fp16; +buffers: the estimate's activations, gathered units, padding, data, shared-memory rings and runtime beside it")
	fmt.Fprintln(stdout, "params/est, optim/est, act/est, alloc/est: the allocator's peaks (MiB) against the estimate's; under bf16/fp16 params are the 2-byte copies, optim holds the float32 masters with the moments and the activations kept for the backward are 2 bytes")
	fmt.Fprintln(stdout, "1 proc: VmHWM of one process training the same global batch (train.batch_size × dp); the ratios divide VmHWM by 1 proc, formula+buffers and est")
	return nil
}
