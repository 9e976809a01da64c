package trainer

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/data"
	"github.com/tinyacc/tinyacc/core/nn"
)

// MemoryEstimator is a plugin's part of the memory estimate made before
// any work (`tinyacc estimate`, and the memory.limit check of `train`):
// the core fills in what one process without plugins allocates, then each
// estimator, in plugin order, rewrites the terms its strategy changes
// (ZeRO divides the optimizer state, tensor parallel the parameters, a
// pipeline the activations of its schedule). The core knows no strategy;
// a plugin that changes memory and implements no estimator is estimated
// as one process.
//
// Implementations run without a group, a model or any buffer: they are
// built from the config alone (see plugins.Estimate) and must compute
// from in the exact sizes their Prepare will allocate.
type MemoryEstimator interface {
	EstimateMemory(in EstimateInput, e *MemoryEstimate) error
}

// EstimateInput is what an estimator knows of the run: the config, the
// model shape and this rank's place in the layout.
type EstimateInput struct {
	Cfg         config.Config
	Model       nn.GPTConfig
	Rank, World int
	// DPRank and DPSize place the rank in the data-parallel group.
	DPRank, DPSize int
	// Params are the parameters this rank holds, after every
	// ParamLocalizer of the run (the whole model's without one).
	Params []nn.ParamShape
}

// ParamLocalizer is implemented by the estimators of plugins that cut
// the parameters (tensor parallel shards them, a pipeline stage keeps
// some): given the parameters as the plugins before it left them, it
// returns those this rank holds, with their local shapes. The core runs
// every localizer, in plugin order, before any EstimateMemory call, and
// counts parameters, gradients and optimizer state from the result, so a
// later plugin (ZeRO) sees the local parameters in EstimateInput.Params.
type ParamLocalizer interface {
	LocalParams(in EstimateInput, ps []nn.ParamShape) []nn.ParamShape
}

// MastersLayer is a MemoryEstimator that places the float32 masters and
// the 2-byte copies of mixed precision itself (ZeRO shards the masters),
// so the estimate keeps its columns instead of rewriting them
// (halfCopies).
type MastersLayer interface {
	LaysOutMasters()
}

// Numel is the number of elements of parameters ps.
func Numel(ps []nn.ParamShape) int64 {
	var n int64
	for _, p := range ps {
		k := int64(1)
		for _, d := range p.Shape {
			k *= int64(d)
		}
		n += k
	}
	return n
}

// TrainedOf are those of parameters ps that take a gradient in model m
// (all but a frozen base's).
func TrainedOf(m nn.GPTConfig, ps []nn.ParamShape) []nn.ParamShape {
	var out []nn.ParamShape
	for _, p := range ps {
		if !m.Frozen(p.Name) {
			out = append(out, p)
		}
	}
	return out
}

// MemoryEstimate is one rank's predicted memory. Its MemoryReport has the
// fields of the run's "kind": "memory" rows, PeakBytes being the
// simultaneous peak of training; the rest is what the process needs
// besides.
type MemoryEstimate struct {
	MemoryReport
	// SetupPeakBytes is the most construction and loading hold beyond
	// training's peak. Construction by placement (construct.go) holds the
	// rank's parts, its gradient buffers and its optimizer state, read
	// straight into place, so this is 0 unless those alone exceed the
	// training peak.
	SetupPeakBytes int64 `json:"setup_peak_bytes"`
	// HeldBytes, set by an estimator whose parameter and gradient columns
	// include buffers only the step holds (ZeRO's gathered units and full
	// gradients), is what the rank holds from construction on: its parts,
	// their gradient buffers and the optimizer state. 0 means those three
	// columns together.
	HeldBytes int64 `json:"-"`
	// DataBytes is the corpus held in memory (text and its tokens; 0 for
	// memory-mapped token shards, whose pages the kernel may drop).
	DataBytes int64 `json:"data_bytes"`
	// RuntimeBytes is the Go runtime, the binary and OpenBLAS's buffers.
	RuntimeBytes int64 `json:"runtime_bytes"`
	// SharedBytes is the shared memory the rank's process maps to reach
	// the other processes of its host (comm.RingBytes; 0 for one process
	// or goroutine ranks): in its resident memory, not in the Go heap.
	SharedBytes int64 `json:"shared_bytes"`
}

// AllocPeakBytes is the most the rank's allocator holds at once: the
// training peak and the set-up's excess, what the run's memory row
// reports as peak_bytes (construction and the steps, nothing reset).
func (e MemoryEstimate) AllocPeakBytes() int64 {
	return e.PeakBytes + e.SetupPeakBytes
}

// ProcessBytes is what the rank's process needs at most: the allocator's
// peak, the data, the runtime and the shared memory of its transport.
func (e MemoryEstimate) ProcessBytes() int64 {
	return e.AllocPeakBytes() + e.DataBytes + e.RuntimeBytes + e.SharedBytes
}

// RuntimeBytes is the stated overhead of a process beside its ranks'
// buffers, corpus and transport's shared memory: the binary's pages
// (about 19 MiB), the Go runtime, OpenBLAS's thread buffers, the
// collectives' segments and the garbage the collector has not freed
// under LimitHeap's limit. Measured beside the allocator's peak it is 26
// to 76 MiB (docs/formulas.md).
const RuntimeBytes = 48 << 20

// ActivationBytes is the activation peak of one micro-batch's forward
// and backward through the whole model m, as the autograd tape allocates
// it, under cfg's batch and recomputation in layout l (fp32; batch B,
// context T, width C, vocabulary V, tensor-parallel degree n). The
// backward frees each activation once the last op backward reading it is
// done and each gradient once consumed (core/tensor.Backward), so the
// peak is what the forward saved (PassActs.Saved: per block BlockActs,
// GPT-2's 18·B·T·C and the attention's log-sum-exp B·H·T, no T×T buffer)
// plus either the output stage's first backward (the logits, their
// softmax and their gradient, 3·B·T·V/n, beside ln_f's output) or one
// op's working buffers in the last block (PassActs.Peak); the embeddings'
// 2·B·T·C and the token ids come before the blocks. No term is the size
// of a weight: the weight gradients accumulate straight into the
// parameters' gradients (counted as gradients), so the activations depend
// on the batch, not on the parameters. TestEstimateMatchesMeasured holds
// the sum to the allocator's count over a grid of shapes, and
// TestNoWeightSizedTemporaries fails if a weight-sized temporary comes
// back. MoE blocks add their difference from a dense block
// (MoEActivationFloats; MoEBlockBytes under mixed precision, where the
// backward of a MoE block widens its rows beside everything saved).
func ActivationBytes(cfg config.Config, m nn.GPTConfig, l ActLayout) int64 {
	p := ModelPass(cfg, m, l)
	held, widened := MoEBlockBytes(m, int64(cfg.Train.BatchSize)*int64(m.BlockSize), 1, l.TP, p.E)
	peak := p.Peak()
	if widened > 0 {
		peak = max(p.HeadMoment(), p.BlockMoment(p.L)+widened)
	}
	return peak + MoEBlocks(m)*held + 1024
}

// ModelPass is one micro-batch's pass through the whole model m (its
// BlockSize the rank's context) under cfg's batch and recomputation.
func ModelPass(cfg config.Config, m nn.GPTConfig, l ActLayout) PassActs {
	B := cfg.Train.BatchSize
	bt, c, v, n := int64(B)*int64(m.BlockSize), int64(m.NEmbd), int64(m.VocabSize), int64(max(1, l.TP))
	emb := m.EmbedActs() * bt * c
	if l.SP {
		emb /= n // sequence parallel's embeddings hold 1/n of the sequence
	}
	e := PassActsE(cfg.Train.MixedPrecision)
	head, held, half := bt*c+2*bt+2*bt*v/n, 3*bt*v/n+4*bt*c+13*bt, int64(0)
	if e < 4 {
		// The logits kept in 2 bytes instead of the probabilities
		// (tensor.CrossEntropy, tensor parallel's vocabulary-parallel
		// one), which the backward widens into their gradient's buffer;
		// a deferred pass holds them (HeadHalf) beside the gradient.
		head, held, half = bt*c+2*bt+bt*v/n, bt*v/n+4*bt*c+13*bt, bt*v/n
	}
	return PassActs{
		Block:     BlockActsOf(m, RecomputeOf(cfg), B, l),
		L:         m.NLayer,
		K:         RecomputedBlocks(cfg, m.NLayer),
		Selective: cfg.Recompute.Granularity == "selective",
		Pre:       emb + 2*bt, // the embeddings' outputs, the token ids and targets
		Head:      head,       // ln_f's output and statistics, the logits and their softmax
		Grad:      bt * v / n, // the logits' gradient
		HeldHead:  held,
		E:         e,
		HeadHalf:  half,
		// A whole model's backward defers nothing.
	}
}

// RankPass is ModelPass on a rank of cfg's tensor- and context-parallel
// layout (T/cp positions, the tp degree, sequence parallel, ring
// attention), whose activations the tp and cp estimators count: for a
// strategy that places its own buffers at the moments of the backward
// (PassActs.HeadMoment, BlockMoment) beside them.
func RankPass(cfg config.Config, m nn.GPTConfig) PassActs {
	p := cfg.Parallel
	if p.CP > 1 {
		m.BlockSize /= p.CP
	}
	return ModelPass(cfg, m, ActLayout{TP: p.TP, SP: p.TP > 1 && cfg.TP.SequenceParallel, Ring: p.CP > 1 && cfg.CP.Attention == "ring"})
}

// EstimateMemory predicts the memory of every rank of a run of cfg on
// world ranks laid out with data-parallel size dpSize (rank r is dp rank
// (r / (tp·cp)) mod dpSize, as core/mesh lays out pp × dp × cp × tp),
// given the estimators of the run's plugins per rank (estimators(r)). It
// allocates nothing. The result has one row per rank, in rank order.
func EstimateMemory(cfg config.Config, world, dpSize int, estimators func(rank int) []MemoryEstimator) ([]MemoryEstimate, error) {
	m := GPTConfig(cfg)
	if err := m.Validate(); err != nil {
		return nil, err
	}
	perElem := int64(8) // AdamW: two moments
	if cfg.Train.Optimizer == "sgd" {
		perElem = 4 // momentum buffer
	}
	dataBytes, err := dataFootprint(cfg)
	if err != nil {
		return nil, err
	}
	out := make([]MemoryEstimate, world)
	for r := range out {
		e := MemoryEstimate{DataBytes: dataBytes, RuntimeBytes: RuntimeBytes}
		e.Rank = r
		in := EstimateInput{Cfg: cfg, Model: m, Rank: r, World: world, DPRank: (r / max(1, cfg.Parallel.TP*cfg.Parallel.CP)) % max(dpSize, 1), DPSize: max(dpSize, 1), Params: m.ParamShapes()}
		var ests []MemoryEstimator
		if estimators != nil {
			ests = estimators(r)
		}
		for _, est := range ests {
			if l, ok := est.(ParamLocalizer); ok {
				in.Params = l.LocalParams(in, in.Params)
			}
		}
		// A frozen base (LoRA) has neither gradients nor optimizer state.
		psi, trained := Numel(in.Params), Numel(TrainedOf(m, in.Params))
		e.ParamsBytes, e.GradsBytes, e.OptimBytes = 4*psi, GradBytesPerElem(cfg)*trained, perElem*trained
		e.ActPeak = ActivationBytes(cfg, m, ActLayout{})
		e.PeakBytes = e.ParamsBytes + e.GradsBytes + e.OptimBytes + e.ActPeak
		for _, est := range ests {
			if err := est.EstimateMemory(in, &e); err != nil {
				return nil, err
			}
		}
		if !laysOutMasters(ests) {
			halfCopies(in, &e)
		}
		held := e.ParamsBytes + e.GradsBytes + e.OptimBytes
		if e.HeldBytes > 0 {
			held = e.HeldBytes
		}
		e.SetupPeakBytes = max(0, held-e.PeakBytes)
		out[r] = e
	}
	return out, nil
}

// halfCopies rewrites an estimate for mixed precision
// (train.mixed_precision bf16 or fp16), after every estimator has placed
// the float32 parameters: those are the masters, counted with the
// optimizer state as the allocator counts them, and the parameters'
// column holds the 2-byte copies the matrix products read (HalfCopyElems),
// which the peak gains. Per parameter a rank holding the whole model then
// needs 2 (copy) + 4 (gradient, GradBytesPerElem) + 4 + 8 (master and
// AdamW's moments). ZeRO, which shards the masters, counts its own
// (MastersLayer).
func halfCopies(in EstimateInput, e *MemoryEstimate) {
	if mp := in.Cfg.Train.MixedPrecision; mp == "" || mp == "no" {
		return
	}
	masters := e.ParamsBytes
	e.OptimBytes += masters
	e.ParamsBytes = 2 * HalfCopyElems(in.Model, in.Params)
	e.PeakBytes += e.ParamsBytes
}

// laysOutMasters reports whether one of ests is a MastersLayer.
func laysOutMasters(ests []MemoryEstimator) bool {
	for _, est := range ests {
		if _, ok := est.(MastersLayer); ok {
			return true
		}
	}
	return false
}

// HalfCopyElems is the number of elements of parameters ps that matrix
// products read, and so have a half-precision copy under mixed precision:
// the 2-D weights, except the position table and an untied token table,
// which are only looked up, and a tied one on a rank without the output
// head (a pipeline's first stage), which only looks it up too.
func HalfCopyElems(m nn.GPTConfig, ps []nn.ParamShape) int64 {
	untied, head := "", false
	for _, p := range ps {
		head = head || p.Name == "ln_f.weight" || p.Name == nn.LlamaNormName
	}
	if m.TiedTable() == "" || !head {
		untied = nn.LlamaEmbedName
		if m.Llama == nil {
			untied = "wte.weight"
		}
	}
	var n int64
	for _, p := range ps {
		if len(p.Shape) != 2 || p.Name == "wpe.weight" || p.Name == untied {
			continue
		}
		n += int64(p.Shape[0]) * int64(p.Shape[1])
	}
	return n
}

// GradBytesPerElem is the bytes of one element of the gradients a rank
// keeps: float32 in every precision, since gradients accumulate in float32
// across micro-batches. Gradients kept in a narrower dtype (a reduction
// dtype of 2 bytes that is also the gradients' storage) would change this
// one number; the strategies' estimators that count gradient buffers of
// their own (ZeRO's shards) state theirs.
func GradBytesPerElem(cfg config.Config) int64 { return 4 }

// dataFootprint is the heap the corpus of cfg takes: a text corpus is kept
// as bytes and as int32 tokens (5 bytes per byte read, at most
// data.max_bytes of it); token shards are memory-mapped and cost none.
func dataFootprint(cfg config.Config) (int64, error) {
	for _, p := range []struct{ key, path string }{{"data.path", cfg.Data.Path}, {"data.val_path", cfg.Data.ValPath}} {
		if err := data.CheckPath(p.key, p.path); err != nil {
			return 0, err
		}
	}
	if cfg.Data.Format == "tokens" {
		return 0, nil
	}
	size := cfg.Data.MaxBytes
	if cfg.Data.Path != "" {
		n, shards, err := pathBytes(cfg.Data.Path)
		if err != nil {
			return 0, err
		}
		if shards && cfg.Data.Format != "text" {
			return 0, nil
		}
		if size <= 0 || n < size {
			size = n
		}
	}
	return 5 * size, nil
}

// pathBytes sums the sizes of the files data.path names (a file, a
// directory or a glob) and says whether the first is a token shard.
func pathBytes(path string) (int64, bool, error) {
	files, err := filepath.Glob(path)
	if err != nil || len(files) == 0 {
		files = []string{path}
	}
	sort.Strings(files)
	var total int64
	shards := false
	for i, f := range files {
		info, err := os.Stat(f)
		if err != nil {
			return 0, false, fmt.Errorf("data: data.path %q: %w", path, err)
		}
		if info.IsDir() {
			err := filepath.Walk(f, func(_ string, fi os.FileInfo, err error) error {
				if err == nil && fi.Mode().IsRegular() {
					total += fi.Size()
				}
				return nil
			})
			if err != nil {
				return 0, false, err
			}
			continue
		}
		total += info.Size()
		if i == 0 {
			shards = isShard(f)
		}
	}
	return total, shards, nil
}

// isShard reports whether the file starts with an llm.c shard header.
func isShard(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	var b [4]byte
	if _, err := f.Read(b[:]); err != nil {
		return false
	}
	magic := int32(uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24)
	return magic == 20240520 || magic == 20240801
}

// WriteEstimateTable prints the per-rank estimate in MiB, in the layout of
// the memory table a run ends with.
func WriteEstimateTable(w interface{ Write([]byte) (int, error) }, es []MemoryEstimate) {
	mib := func(b int64) string { return strconv.FormatFloat(float64(b)/(1<<20), 'f', 2, 64) }
	fmt.Fprintf(w, "estimate (MiB) %5s %9s %9s %9s %12s %9s %9s %9s %9s %9s\n", "rank", "params", "grads", "optim", "activations", "comm", "peak", "set-up", "data", "process")
	for _, e := range es {
		fmt.Fprintf(w, "               %5d %9s %9s %9s %12s %9s %9s %9s %9s %9s\n", e.Rank, mib(e.ParamsBytes), mib(e.GradsBytes),
			mib(e.OptimBytes), mib(e.ActPeak), mib(e.CommBytes), mib(e.PeakBytes), mib(e.SetupPeakBytes), mib(e.DataBytes), mib(e.ProcessBytes()))
	}
}

// CheckMemory refuses a run whose estimate does not fit: each of the
// ranks sharing this host (local of them) gets limit/local bytes. It names
// the rank, the biggest item and what to change.
func CheckMemory(es []MemoryEstimate, limit int64, local int, source string) error {
	if limit <= 0 || len(es) == 0 {
		return nil
	}
	per := limit / int64(max(local, 1))
	for _, e := range es {
		total := e.ProcessBytes()
		if total <= per {
			continue
		}
		items := []struct {
			name   string
			bytes  int64
			change string
		}{
			{"activations", e.ActPeak, "lower train.batch_size (raise train.grad_accum to keep the global batch) or model.block_size"},
			{"optimizer state", e.OptimBytes, "shard it over the ranks (zero.stage, parallel.tp, parallel.pp)"},
			{"gradients", e.GradsBytes, "shard them over the ranks (zero.stage, parallel.tp, parallel.pp)"},
			{"parameters", e.ParamsBytes, "shard them over the ranks (zero.stage=3, parallel.tp, parallel.pp), or a smaller model (model.n_layer, model.n_embd, model.vocab_size)"},
			{"data", e.DataBytes, "lower data.max_bytes, or pre-tokenize the corpus into shards (tinyacc tokenize) which are memory-mapped"},
			{"set-up", e.SetupPeakBytes, "a smaller model"},
			{"communication buffers", e.CommBytes, "smaller ddp.bucket_mb"},
		}
		sort.SliceStable(items, func(i, j int) bool { return items[i].bytes > items[j].bytes })
		how := ""
		if local > 1 {
			how = fmt.Sprintf(" (%s shared by %d ranks on this host)", mib(limit), local)
		}
		return fmt.Errorf("memory: rank %d needs about %s but the limit is %s per rank%s from memory.limit=%s; the biggest item is %s (%s): %s, or set memory.limit to a larger size (0 turns the check off)",
			e.Rank, mib(total), mib(per), how, source, items[0].name, mib(items[0].bytes), items[0].change)
	}
	return nil
}

// FormatBytes writes a size as the memory messages do: MiB, or GiB from
// 1 GiB on.
func FormatBytes(b int64) string { return mib(b) }

func mib(b int64) string {
	if b >= 1<<30 {
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

// HostMemoryLimit is memory.limit=auto: the cgroup's memory limit when the
// process is in one that sets it, else the host's MemAvailable; 0 when
// neither can be read (no check).
func HostMemoryLimit() (int64, string) {
	for _, p := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err == nil && n > 0 && n < 1<<60 {
			return n, "auto (the cgroup limit " + mib(n) + ")"
		}
	}
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, "auto (unknown)"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				if kb, err := strconv.ParseInt(f[0], 10, 64); err == nil {
					return kb << 10, "auto (MemAvailable " + mib(kb<<10) + ")"
				}
			}
		}
	}
	return 0, "auto (unknown)"
}

// RSSPeakBytes is the process's resident peak (VmHWM), 0 where
// /proc/self/status cannot be read.
func RSSPeakBytes() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				if kb, err := strconv.ParseInt(f[0], 10, 64); err == nil {
					return kb << 10
				}
			}
		}
	}
	return 0
}
