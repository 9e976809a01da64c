package config

import (
	"fmt"
	"strconv"
)

// The model architecture. model.arch picks gpt2 (the default) or llama;
// the llama keys shape the second and mean nothing to the first, so one
// set to a value other than its default with gpt2 is a mistake to report,
// not to ignore. A key at its default value cannot count as given: a
// fully resolved config (every key written out, as config files and
// bindings pass it on) must load again. model.tie_embeddings is the one
// key whose default depends on the architecture (resolveTie): true for
// gpt2, where false is an error, and false for llama.

// The defaults of the llama keys.
const (
	DefaultRopeTheta = 10000
	DefaultNormEps   = 1e-5
)

// llamaKeys are the keys only model.arch=llama reads, with whether the
// value v holds is its default.
func (c *Config) llamaKeys() []struct {
	key, value string
	isDefault  bool
} {
	m := &c.Model
	return []struct {
		key, value string
		isDefault  bool
	}{
		{"model.n_kv_head", strconv.Itoa(m.NKVHead), m.NKVHead == 0},
		{"model.intermediate_size", strconv.Itoa(m.IntermediateSize), m.IntermediateSize == 0},
		{"model.rope_theta", ff(m.RopeTheta), m.RopeTheta == DefaultRopeTheta},
		{"model.norm_eps", ff(m.NormEps), m.NormEps == DefaultNormEps},
	}
}

// KVHeads is model.n_kv_head with its default (model.n_head) applied.
func (c *Config) KVHeads() int {
	if c.Model.NKVHead == 0 {
		return c.Model.NHead
	}
	return c.Model.NKVHead
}

// FFNWidth is model.intermediate_size with its default applied: 8/3 of
// n_embd rounded up to a multiple of 64 (the SwiGLU width that keeps the
// MLP's parameter count near a 4·n_embd GELU MLP's).
func (c *Config) FFNWidth() int {
	if c.Model.IntermediateSize > 0 {
		return c.Model.IntermediateSize
	}
	return DefaultIntermediateSize(c.Model.NEmbd)
}

// DefaultIntermediateSize is 8·nEmbd/3 rounded up to a multiple of 64.
func DefaultIntermediateSize(nEmbd int) int {
	w := (8*nEmbd + 2) / 3
	return (w + 63) / 64 * 64
}

// resolveTie gives model.tie_embeddings its default for the architecture
// once the layers are read (origin: where its value came from, "default"
// when no layer set it). The default config is GPT-2's, whose head is
// always the token table: true, and a given false is an error. A Llama's
// head is its own lm_head unless the key says true, so an unset key
// resolves to false there. A resolved config therefore says what the
// model is, and written out in full it loads again.
func (c *Config) resolveTie(origin string) error {
	if c.Model.Arch == "llama" {
		if origin == "default" || origin == "" {
			c.Model.TieEmbeddings = false
		}
		return nil
	}
	if !c.Model.TieEmbeddings {
		return fmt.Errorf("config: model.tie_embeddings=false (from %s) with model.arch=%s: GPT-2's output head is always its token table; drop the key, or set model.arch=llama for an untied lm_head", origin, c.Model.Arch)
	}
	return nil
}

// validateArch checks model.arch and the llama keys.
func (c *Config) validateArch(v *validator) {
	m := &c.Model
	v.oneOf("model.arch", m.Arch, "gpt2", "llama")
	if m.Arch != "llama" {
		for _, k := range c.llamaKeys() {
			if !k.isDefault {
				v.addf("config: %s=%s is a llama key, but model.arch=%s: drop %s or set model.arch=llama", k.key, k.value, m.Arch, k.key)
			}
		}
		return
	}
	if m.NKVHead < 0 {
		v.addf("config: model.n_kv_head=%d must not be negative: use 0 (the default: n_head) or a divisor of model.n_head", m.NKVHead)
	} else if kv := c.KVHeads(); m.NHead > 0 && kv > 0 && m.NHead%kv != 0 {
		v.addf("config: model.n_head=%d is not divisible by model.n_kv_head=%d: every key/value head serves the same number of query heads; choose n_kv_head a divisor of n_head", m.NHead, kv)
	}
	if m.NHead > 0 && m.NEmbd > 0 && m.NEmbd%m.NHead == 0 && (m.NEmbd/m.NHead)%2 != 0 {
		v.addf("config: model.n_embd=%d / model.n_head=%d = %d is an odd head size: rotary embeddings turn pairs of a head's dimensions; choose an even n_embd/n_head", m.NEmbd, m.NHead, m.NEmbd/m.NHead)
	}
	v.nonNegative("model.intermediate_size", int64(m.IntermediateSize))
	if !(m.RopeTheta > 0) {
		v.addf("config: model.rope_theta=%s must be > 0: use 10000 (Llama 2) or 500000 (Llama 3)", ff(m.RopeTheta))
	}
	if !(m.NormEps > 0) {
		v.addf("config: model.norm_eps=%s must be > 0: use a small value such as 1e-5", ff(m.NormEps))
	}
	if tp := c.Parallel.TP; tp > 1 {
		if kv := c.KVHeads(); m.NKVHead >= 0 && kv > 0 && kv%tp != 0 {
			v.addf("config: model.n_kv_head=%d is not divisible by parallel.tp=%d: tensor parallel gives every rank the same number of key/value heads; choose n_kv_head a multiple of tp", kv, tp)
		}
		if w := c.FFNWidth(); m.IntermediateSize >= 0 && w%tp != 0 {
			v.addf("config: model.intermediate_size=%d is not divisible by parallel.tp=%d: tensor parallel splits the SwiGLU width; choose intermediate_size a multiple of tp", w, tp)
		}
	}
}
