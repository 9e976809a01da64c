package trainer

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
)

// CheckpointModel returns the model shape a checkpoint's index records.
func CheckpointModel(ix *ckpt.Index) (nn.GPTConfig, error) {
	get := func(key string) (int, error) {
		v, ok := ix.Config[key]
		if !ok {
			return 0, fmt.Errorf("ckpt: the index records no %s", key)
		}
		n, err := strconv.Atoi(fmt.Sprint(v))
		if err != nil {
			return 0, fmt.Errorf("ckpt: the index records %s=%v, not a whole number", key, v)
		}
		return n, nil
	}
	var c nn.GPTConfig
	var err error
	for _, f := range []struct {
		key string
		dst *int
	}{{"model.n_layer", &c.NLayer}, {"model.n_head", &c.NHead}, {"model.n_embd", &c.NEmbd},
		{"model.block_size", &c.BlockSize}, {"model.vocab_size", &c.VocabSize}} {
		if *f.dst, err = get(f.key); err != nil {
			return c, err
		}
	}
	if fmt.Sprint(ix.Config["model.arch"]) == strconv.Quote("llama") { // config.Values quotes strings
		values := map[string]any{}
		for k, v := range ix.Config {
			if s := fmt.Sprint(v); strings.HasPrefix(k, "model.") {
				if u, err := strconv.Unquote(s); err == nil {
					s = u
				}
				values[k] = s
			}
		}
		if c, err = modelOf(values); err != nil {
			return c, fmt.Errorf("ckpt: the index's model keys: %w", err)
		}
	}
	if c.MoE, err = checkpointMoE(ix.Config); err != nil { // moe.go
		return c, err
	}
	return c, c.Validate()
}

// ExportCheckpoint writes the weights of checkpoint dir as one GPT-2
// safetensors file, the one `save_to` writes at the same step: Hugging
// Face names, Conv1D layout, the tied head not duplicated, the model shape
// as metadata. It assembles one global tensor at a time from its stored
// pieces, after verifying every file's digest. A missing directory of to
// is created, as train creates save_to's (OutputDir).
func ExportCheckpoint(dir, to string) error { return ExportCheckpointAs(dir, to, "") }

// ExportCheckpointAs is ExportCheckpoint writing the weights in dtype:
// "fp32" (float32), "bf16" (bfloat16, each rounded to nearest even from
// the float32 master) or "" for the dtype the checkpoint holds (float32,
// or float64 for a train.dtype=float64 run). A float64 checkpoint is
// rounded to float32 first.
func ExportCheckpointAs(dir, to, dtype string) error {
	var out tensor.DType
	switch dtype {
	case "", "fp32":
		out = tensor.Float32
	case "bf16":
		out = tensor.BFloat16
	default:
		return fmt.Errorf("export: --dtype %q: use fp32 or bf16", dtype)
	}
	ix, err := ckpt.ReadIndex(dir)
	if err != nil {
		return err
	}
	if err := OutputDir("export --to", parentOf(to)); err != nil {
		return err
	}
	if ix.LoRABase != "" {
		return fmt.Errorf("export: %s holds LoRA adapters, not a model: export them with --lora (a PEFT adapter directory) or --merge-lora (the base with them merged in)", dir)
	}
	if err := ix.Verify(dir); err != nil {
		return err
	}
	mc, err := CheckpointModel(ix)
	if err != nil {
		return err
	}
	shapes := mc.ParamShapes()
	entries := make([]ckpt.Entry, len(shapes))
	for i, ps := range shapes {
		ti := ix.Tensors[ps.Name]
		if ti == nil {
			return fmt.Errorf("ckpt: %s holds no tensor %s", dir, ps.Name)
		}
		entries[i] = ckpt.Entry{Name: ps.Name, DType: storedDType(ti), Shape: ps.Shape}
		if dtype != "" {
			entries[i].DType = out
		}
	}
	slices.SortFunc(entries, func(a, b ckpt.Entry) int { return strings.Compare(a.Name, b.Name) })
	readers := map[string]*ckpt.Reader{}
	defer func() {
		for _, r := range readers {
			r.Close()
		}
	}()
	var last *tensor.Tensor
	err = ckpt.SaveStream(to, entries, weightsMeta(mc), func(name string) (*tensor.Tensor, error) {
		ti := ix.Tensors[name]
		if last == nil || !slices.Equal(last.Shape(), ti.Shape) || last.DType() != storedDType(ti) {
			last = tensor.New(storedDType(ti), ti.Shape...)
		}
		n := 0
		for _, p := range ti.Parts {
			r := readers[p.File]
			if r == nil {
				if r, err = ckpt.Open(filepath.Join(dir, p.File)); err != nil {
					return nil, err
				}
				readers[p.File] = r
			}
			buf := tensor.New(last.DType(), max(0, r.Numel(p.Key)))
			if err := r.Read(p.Key, buf); err != nil {
				return nil, err
			}
			gatherInto(p.Spec, p.Coord, buf, last)
			n += buf.Numel()
		}
		if n != last.Numel() {
			return nil, fmt.Errorf("ckpt: the parts of %s hold %d of its %d elements", name, n, last.Numel())
		}
		if dtype == "" || out == last.DType() {
			return last, nil
		}
		return convertWeights(last, out), nil
	})
	if err != nil || len(entries) == 0 {
		return err
	}
	return writeHFConfig(mc, entries[0].DType.String(), to)
}

// convertWeights returns t's numbers in dtype d (Float32 or BFloat16),
// rounded to nearest even.
func convertWeights(t *tensor.Tensor, d tensor.DType) *tensor.Tensor {
	f := t
	if t.DType() == tensor.Float64 {
		f = tensor.New(tensor.Float32, t.Shape()...)
		for i, v := range t.F64() {
			f.F32()[i] = float32(v)
		}
	}
	if d == tensor.Float32 {
		return f
	}
	h := tensor.New(d, t.Shape()...)
	cpu.BF16FromF32s(h.U16(), f.F32())
	return h
}

// storedDType is the dtype a checkpoint holds a tensor in: float64 for a
// run of train.dtype float64, else float32.
func storedDType(ti *ckpt.TensorInfo) tensor.DType {
	if ti.DType == tensor.Float64.String() {
		return tensor.Float64
	}
	return tensor.Float32
}
