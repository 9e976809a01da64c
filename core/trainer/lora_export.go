package trainer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// Exporting a LoRA checkpoint: the adapters as Hugging Face PEFT lays
// them out for the Hugging Face model class (`export --lora`), or the base
// with the adapters merged in (`export --merge-lora`).

// PEFT's file names in an adapter directory.
const (
	AdapterWeightsFile = "adapter_model.safetensors"
	AdapterConfigFile  = "adapter_config.json"
)

// checkpointRun is the run configuration a checkpoint's index records
// (its model.* and lora.* keys, and init_from), as config.Values printed
// it.
func checkpointRun(ix *ckpt.Index) (*config.Config, error) {
	values := map[string]any{}
	for k, v := range ix.Config {
		if strings.HasPrefix(k, "model.") || strings.HasPrefix(k, "lora.") || k == "init_from" || k == "train.seed" || k == "train.dtype" {
			s := fmt.Sprint(v)
			if u, err := strconv.Unquote(s); err == nil {
				s = u
			}
			values[k] = s
		}
	}
	cfg, err := config.FromMap(values)
	if err != nil {
		return nil, fmt.Errorf("ckpt: the index's model and lora keys: %w", err)
	}
	return cfg, nil
}

// PEFTName is the name PEFT gives parameter name of model c inside an
// adapter file: "base_model.model." and the Hugging Face model class's
// name (GPT-2's under "transformer.").
func PEFTName(c nn.GPTConfig, name string) string {
	if c.Llama == nil {
		return "base_model.model.transformer." + name
	}
	return "base_model.model." + name
}

// PEFTConfig is adapter_config.json: what PEFT's LoraConfig needs to
// load the adapters onto the base model class.
type PEFTConfig struct {
	PEFTType        string   `json:"peft_type"`
	TaskType        string   `json:"task_type"`
	R               int      `json:"r"`
	LoRAAlpha       float64  `json:"lora_alpha"`
	LoRADropout     float64  `json:"lora_dropout"`
	TargetModules   []string `json:"target_modules"`
	FanInFanOut     bool     `json:"fan_in_fan_out"` // GPT-2's Conv1D stores [in, out]
	Bias            string   `json:"bias"`
	InferenceMode   bool     `json:"inference_mode"`
	BaseModel       string   `json:"base_model_name_or_path"`
	InitLoRAWeights bool     `json:"init_lora_weights"`
	UseRSLoRA       bool     `json:"use_rslora"`
	ModulesToSave   []string `json:"modules_to_save"`
}

// openLoRACheckpoint reads and verifies a LoRA checkpoint and its run.
func openLoRACheckpoint(dir string) (*ckpt.Index, *config.Config, nn.GPTConfig, error) {
	ix, err := ckpt.ReadIndex(dir)
	if err != nil {
		return nil, nil, nn.GPTConfig{}, err
	}
	if ix.LoRABase == "" {
		return nil, nil, nn.GPTConfig{}, fmt.Errorf("export: %s is no LoRA checkpoint (its run had lora.rank=0): export it without --lora or --merge-lora", dir)
	}
	if err := ix.Verify(dir); err != nil {
		return nil, nil, nn.GPTConfig{}, err
	}
	cfg, err := checkpointRun(ix)
	if err != nil {
		return nil, nil, nn.GPTConfig{}, err
	}
	return ix, cfg, GPTConfig(*cfg), nil
}

// ExportLoRA writes the adapters of LoRA checkpoint dir into directory
// to: adapter_model.safetensors (PEFT's names, lora_A [r, in], lora_B
// [out, r], and the biases under lora.train_biases=all) and
// adapter_config.json.
func ExportLoRA(dir, to string) error {
	ix, cfg, mc, err := openLoRACheckpoint(dir)
	if err != nil {
		return err
	}
	if err := OutputDir("export --to", to); err != nil {
		return err
	}
	shapes := mc.TrainedShapes()
	rd := &pieceReader{dir: dir, ix: ix, readers: map[string]*ckpt.Reader{}}
	defer rd.close()
	ts := map[string]*tensor.Tensor{}
	for _, ps := range shapes {
		v, err := rd.tensor(ps.Name)
		if err != nil {
			return err
		}
		ts[PEFTName(mc, ps.Name)] = v
	}
	if err := ckpt.Save(filepath.Join(to, AdapterWeightsFile), ts, map[string]string{"format": "pt"}); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	l := cfg.LoRA
	pc := PEFTConfig{PEFTType: "LORA", TaskType: "CAUSAL_LM", R: l.Rank, LoRAAlpha: l.Alpha, LoRADropout: l.Dropout,
		TargetModules: l.Targets, FanInFanOut: mc.Llama == nil, Bias: l.TrainBiases, InferenceMode: true,
		BaseModel: cfg.InitFrom, InitLoRAWeights: true}
	b, err := json.MarshalIndent(pc, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(to, AdapterConfigFile), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	return nil
}

// ExportMerged writes the base of LoRA checkpoint dir with its adapters
// merged in, as one weights file to (the base's names and layout): each
// targeted weight W becomes W + (alpha/rank)·B·A (transposed for GPT-2's
// [in, out] Conv1D weights), and under lora.train_biases=all the biases
// are the trained ones. The base is base, or the checkpoint's init_from;
// its SHA-256 must be the one the adapters were trained on.
func ExportMerged(dir, base, to string) error {
	ix, cfg, mc, err := openLoRACheckpoint(dir)
	if err != nil {
		return err
	}
	if base == "" {
		base = cfg.InitFrom
	}
	if base == "" {
		return fmt.Errorf("export --merge-lora: the run of %s trained on a fresh random base (no init_from); give the base with --base FILE", dir)
	}
	c := *cfg
	c.InitFrom = base
	if d, err := BaseDigest(c); err != nil {
		return err
	} else if d != ix.LoRABase {
		return fmt.Errorf("export --merge-lora: %s has SHA-256 %s, but the adapters of %s were trained on the base with %s: give that base with --base FILE", base, d, dir, ix.LoRABase)
	}
	if err := OutputDir("export --to", parentOf(to)); err != nil {
		return err
	}
	baseCfg := mc
	baseCfg.LoRA = nil
	w, err := openWeights(base, baseCfg)
	if err != nil {
		return err
	}
	defer w.Close()
	rd := &pieceReader{dir: dir, ix: ix, readers: map[string]*ckpt.Reader{}}
	defer rd.close()
	// The adapter of each targeted weight, by the weight's name.
	type pair struct{ a, b string }
	adapterOf := map[string]pair{}
	for i := 0; i < mc.NLayer; i++ {
		prefix := fmt.Sprintf("h.%d", i)
		if mc.Llama != nil {
			prefix = fmt.Sprintf("model.layers.%d", i)
		}
		for _, t := range mc.Adapted() {
			a, b := nn.LoRANames(prefix, t)
			adapterOf[prefix+"."+t.Module+".weight"] = pair{a, b}
		}
	}
	dtype := storedDType(ix.Tensors[mc.TrainedShapes()[0].Name])
	shapes := baseCfg.ParamShapes()
	entries := make([]ckpt.Entry, len(shapes))
	shapeOf := map[string][]int{}
	for i, ps := range shapes {
		entries[i] = ckpt.Entry{Name: ps.Name, DType: dtype, Shape: ps.Shape}
		shapeOf[ps.Name] = ps.Shape
	}
	slices.SortFunc(entries, func(a, b ckpt.Entry) int { return strings.Compare(a.Name, b.Name) })
	scale := cfg.LoRAScale()
	return ckpt.SaveStream(to, entries, weightsMeta(baseCfg), func(name string) (*tensor.Tensor, error) {
		if ti := ix.Tensors[name]; ti != nil { // a trained bias
			return rd.tensor(name)
		}
		v := tensor.New(dtype, shapeOf[name]...)
		if err := w.fill(place.NewSpec(name, shapeOf[name]), place.Single, v); err != nil {
			return nil, err
		}
		ad, ok := adapterOf[name]
		if !ok {
			return v, nil
		}
		A, err := rd.tensor(ad.a)
		if err != nil {
			return nil, err
		}
		B, err := rd.tensor(ad.b)
		if err != nil {
			return nil, err
		}
		mergeInto(v, A, B, scale, mc.Llama == nil)
		return v, nil
	})
}

// mergeInto adds scale·B·A (A [r, in], B [out, r]) to w: w is [out, in]
// (nn.Linear), or [in, out] when conv1d (GPT-2), which takes the
// transpose.
func mergeInto(w, A, B *tensor.Tensor, scale float64, conv1d bool) {
	r, in, out := A.Dim(0), A.Dim(1), B.Dim(0)
	for o := 0; o < out; o++ {
		for i := 0; i < in; i++ {
			var s float64
			for k := 0; k < r; k++ {
				s += B.At(o*r+k) * A.At(k*in+i)
			}
			at := o*in + i
			if conv1d {
				at = i*out + o
			}
			w.Set(at, w.At(at)+scale*s)
		}
	}
}

// pieceReader assembles a checkpoint's global tensors from their stored
// pieces, one at a time.
type pieceReader struct {
	dir     string
	ix      *ckpt.Index
	readers map[string]*ckpt.Reader
}

func (p *pieceReader) close() {
	for _, r := range p.readers {
		r.Close()
	}
}

// tensor returns global tensor name, whole.
func (p *pieceReader) tensor(name string) (*tensor.Tensor, error) {
	ti := p.ix.Tensors[name]
	if ti == nil {
		return nil, fmt.Errorf("ckpt: %s holds no tensor %s", p.dir, name)
	}
	out := tensor.New(storedDType(ti), ti.Shape...)
	n := 0
	for _, part := range ti.Parts {
		r := p.readers[part.File]
		if r == nil {
			var err error
			if r, err = ckpt.Open(filepath.Join(p.dir, part.File)); err != nil {
				return nil, err
			}
			p.readers[part.File] = r
		}
		buf := tensor.New(out.DType(), max(0, r.Numel(part.Key)))
		if err := r.Read(part.Key, buf); err != nil {
			return nil, err
		}
		gatherInto(part.Spec, part.Coord, buf, out)
		n += buf.Numel()
	}
	if n != out.Numel() {
		return nil, fmt.Errorf("ckpt: the parts of %s hold %d of its %d elements", name, n, out.Numel())
	}
	return out, nil
}
