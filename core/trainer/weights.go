package trainer

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/nn"
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
	shapes := mc.ParamShapes()
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
	err := ckpt.SaveStream(path, entries, weightsMeta(mc), func(name string) (*tensor.Tensor, error) {
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

// LoadWeights copies the tensors of a safetensors file into m's parameters.
// A "transformer." prefix (Hugging Face GPT2LMHeadModel) is accepted. Names
// the model lacks, parameters the file lacks and shape mismatches are
// errors listing every offender.
func LoadWeights(m *nn.GPT, path string) error {
	ts, _, err := ckpt.Load(path)
	if err != nil {
		return fmt.Errorf("init_from: %w", err)
	}
	byName := map[string]*tensor.Tensor{}
	for name, t := range ts {
		name = strings.TrimPrefix(name, "transformer.")
		if skippedName(name) && m.Param(name) == nil { // an untied Llama's lm_head is a parameter
			continue
		}
		byName[name] = t
	}
	names := make([]string, 0, len(byName))
	for name := range byName {
		names = append(names, name)
	}
	sort.Strings(names)
	if err := checkFiniteTensors("init_from "+path, names, byName); err != nil {
		return err
	}
	var problems []string
	for _, p := range m.Params() {
		t, ok := byName[p.Name]
		if !ok {
			problems = append(problems, fmt.Sprintf("missing %s %v", p.Name, p.Shape()))
			continue
		}
		delete(byName, p.Name)
		if !slices.Equal(t.Shape(), p.Shape()) {
			problems = append(problems, fmt.Sprintf("%s has shape %v in the file but %v in the model", p.Name, t.Shape(), p.Shape()))
			continue
		}
		for i := 0; i < p.Numel(); i++ {
			p.Set(i, t.At(i))
		}
	}
	var extra []string
	for name := range byName {
		extra = append(extra, name)
	}
	sort.Strings(extra)
	for _, name := range extra {
		problems = append(problems, "unknown tensor "+name)
	}
	if len(problems) > 0 {
		return fmt.Errorf("init_from %s does not fit the model (check model.* against the file): %s", path, strings.Join(problems, "; "))
	}
	return nil
}

// ModelConfigFromMetadata reads the model shape a SaveWeights file records.
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
	for _, f := range fields {
		v, err := strconv.Atoi(meta[f.key])
		if err != nil {
			return c, false
		}
		*f.dst = v
	}
	return c, true
}
