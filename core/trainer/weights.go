package trainer

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// SaveWeights writes a whole model's parameters in safetensors format
// under their Hugging Face GPT-2 names, atomically, with the model shape
// in the metadata so `tinyacc sample` can rebuild it.
func SaveWeights(m *nn.GPT, path string) error {
	if !m.Whole() {
		return fmt.Errorf("save_to: this model is a pipeline stage; save through the trainer, which gathers every stage")
	}
	ts := map[string]*tensor.Tensor{}
	var names []string
	for _, p := range m.Params() {
		ts[p.Name] = p
		names = append(names, p.Name)
	}
	// Non-finite weights are worthless; the file already at path is kept.
	if err := checkFiniteTensors("save_to "+path+" not written", names, ts); err != nil {
		return err
	}
	if err := ckpt.Save(path, ts, weightsMeta(m.Config)); err != nil {
		return fmt.Errorf("save_to: %w", err)
	}
	return nil
}

// weightsMeta is the metadata of a weights file: the model shape, nothing
// else, so equal weights give byte-equal files.
func weightsMeta(c nn.GPTConfig) map[string]string {
	m := map[string]string{
		"format": "pt", "producer": "tinyacc",
		"n_layer": strconv.Itoa(c.NLayer), "n_head": strconv.Itoa(c.NHead), "n_embd": strconv.Itoa(c.NEmbd),
		"block_size": strconv.Itoa(c.BlockSize), "vocab_size": strconv.Itoa(c.VocabSize),
	}
	for k, v := range llamaKeys(c) {
		m[k] = v
	}
	if e := c.MoE; e.Experts > 0 { // the experts decide the parameters and the routing
		m["moe.experts"], m["moe.top_k"], m["moe.every"] = strconv.Itoa(e.Experts), strconv.Itoa(e.TopK), strconv.Itoa(e.Every)
		m["moe.capacity_factor"] = strconv.FormatFloat(e.CapacityFactor, 'g', -1, 64)
	}
	return m
}

// SaveModel writes the weights this trainer trains to path from rank 0,
// whatever the layout: every global tensor is gathered through its
// placement (GatherParam), one at a time, and streamed into the file, so
// no rank ever holds more than one full tensor beyond its own part. It is
// collective: every rank must call it. Bindings save a prepared model
// through it.
func (t *Trainer) SaveModel(path string) error {
	mc := t.Model.Config
	shapes := mc.TrainedShapes() // under LoRA the adapters: the base is init_from (lora.go)
	entries := make([]ckpt.Entry, len(shapes))
	byName := map[string]nn.ParamShape{}
	for i, ps := range shapes {
		entries[i] = ckpt.Entry{Name: ps.Name, DType: t.DType(), Shape: ps.Shape}
		byName[ps.Name] = ps
	}
	// Every rank gathers in the order the file is written: by name.
	slices.SortFunc(entries, func(a, b ckpt.Entry) int { return strings.Compare(a.Name, b.Name) })
	if t.Rank != 0 {
		for _, e := range entries {
			if _, err := t.GatherParam(byName[e.Name], 0); err != nil {
				return fmt.Errorf("save_to: %w", err)
			}
		}
		return nil
	}
	var last *tensor.Tensor
	done := 0
	meta := weightsMeta(mc)
	base, err := t.loraBase()
	if base != "" {
		loraMeta(meta, t.Cfg, base)
	}
	if err == nil {
		err = ckpt.SaveStream(path, entries, meta, func(name string) (*tensor.Tensor, error) {
			if last != nil {
				last.Release()
			}
			var err error
			last, err = t.GatherParam(byName[name], 0)
			done++
			if err == nil {
				// Non-finite weights are worthless; the file at path is kept.
				if i, bad := firstNonFinite(last); bad {
					err = fmt.Errorf("save_to %s not written: tensor %s holds a non-finite value (element %d = %v)", path, name, i, last.At(i))
				}
			}
			return last, err
		})
	}
	if last != nil {
		last.Release()
	}
	if err != nil {
		// The other ranks take part in every gather whatever happened
		// here: finish them so no rank waits for a collective that never
		// comes.
		for _, e := range entries[done:] {
			if g, gerr := t.GatherParam(byName[e.Name], 0); gerr == nil {
				g.Release()
			}
		}
		return fmt.Errorf("save_to: %w", err)
	}
	return nil
}

// skippedName reports names real GPT-2 files carry that are not parameters:
// the attention mask buffers, and the output head, which is tied to wte.
func skippedName(name string) bool {
	return strings.HasSuffix(name, ".attn.bias") || strings.HasSuffix(name, ".attn.masked_bias") || name == nn.LlamaHeadName
}

// LoadWeights copies the tensors of a safetensors file into m's parameters,
// each reading only the bytes of the part it holds. A "transformer."
// prefix (Hugging Face GPT2LMHeadModel) is accepted. Names the model
// lacks, parameters the file lacks and shape mismatches are errors listing
// every offender, and a non-finite value is refused, all before any
// parameter changes.
func LoadWeights(m *nn.GPT, path string) error {
	w, err := openWeights(path, m.Config)
	if err != nil {
		return err
	}
	defer w.Close()
	for _, p := range m.Params() {
		if nn.IsAdapter(p.Name) {
			continue // a base file holds no adapters: they keep their values
		}
		if err := w.verify(p.Spec, place.Single, p.DType()); err != nil {
			return err
		}
	}
	for _, p := range m.Params() {
		if nn.IsAdapter(p.Name) {
			continue
		}
		if err := w.fill(p.Spec, place.Single, p); err != nil {
			return err
		}
	}
	return nil
}

// LoadWeights copies a weights file (as the function LoadWeights reads)
// into every part of every parameter this rank holds, wherever it lives
// (Holding: a tensor-parallel shard, a pipeline stage, ZeRO's flat
// shards), reading only those parts' byte ranges. The file is checked
// whole against the model, and every part read for non-finite values,
// before any parameter changes. It is not collective.
func (t *Trainer) LoadWeights(path string) error {
	w, err := openWeights(path, t.Model.Config)
	if err != nil {
		return err
	}
	defer w.Close()
	c := t.Coord()
	for _, p := range t.Model.Params() {
		h, err := t.Holding(p)
		if err != nil {
			return err
		}
		if h.Value.Data != nil && !nn.IsAdapter(p.Name) {
			if err := w.verify(h.Value.Spec, c, h.Value.Data.DType()); err != nil {
				return err
			}
		}
	}
	// A base file holds no adapters (LoRA): they keep their values.
	return t.fillParams(baseFrom(w.fill, func(*place.Spec, place.Coord, *tensor.Tensor) error { return nil }))
}

// ModelConfigFromMetadata reads the model shape a SaveWeights file records,
// its experts included (moe.experts, top_k, every, capacity_factor).
func ModelConfigFromMetadata(meta map[string]string) (nn.GPTConfig, bool) {
	if meta["arch"] == "llama" {
		values := map[string]any{}
		for k, v := range meta {
			if k != "format" && k != "producer" {
				values["model."+k] = v
			}
		}
		c, err := modelOf(values)
		return c, err == nil
	}
	var c nn.GPTConfig
	fields := []struct {
		key string
		dst *int
	}{{"n_layer", &c.NLayer}, {"n_head", &c.NHead}, {"n_embd", &c.NEmbd}, {"block_size", &c.BlockSize}, {"vocab_size", &c.VocabSize}}
	if meta["moe.experts"] != "" {
		fields = append(fields, []struct {
			key string
			dst *int
		}{{"moe.experts", &c.MoE.Experts}, {"moe.top_k", &c.MoE.TopK}, {"moe.every", &c.MoE.Every}}...)
		f, err := strconv.ParseFloat(meta["moe.capacity_factor"], 64)
		if err != nil {
			return c, false
		}
		c.MoE.CapacityFactor = f
	}
	for _, f := range fields {
		v, err := strconv.Atoi(meta[f.key])
		if err != nil {
			return c, false
		}
		*f.dst = v
	}
	return c, true
}
