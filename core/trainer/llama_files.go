package trainer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/nn"
)

// llamaKeys are the metadata a Llama's weights file adds to GPT-2's shape
// keys (none for GPT-2, whose files stay as they were).
func llamaKeys(c nn.GPTConfig) map[string]string {
	l := c.Llama
	if l == nil {
		return nil
	}
	return map[string]string{
		"arch": "llama", "n_kv_head": strconv.Itoa(l.NKVHead), "intermediate_size": strconv.Itoa(l.Intermediate),
		"rope_theta": strconv.FormatFloat(l.RopeTheta, 'g', -1, 64), "norm_eps": strconv.FormatFloat(l.NormEps, 'g', -1, 64),
		"tie_embeddings": strconv.FormatBool(l.Tied),
	}
}

// modelOf is the model shape of model.* values (a checkpoint's index, a
// weights file's metadata) through the config's defaults and checks, the
// rules a run's own model is built by.
func modelOf(values map[string]any) (nn.GPTConfig, error) {
	cfg, err := config.FromMap(values)
	if err != nil {
		return nn.GPTConfig{}, err
	}
	return GPTConfig(*cfg), nil
}

// HFConfig is a Llama's config.json in Hugging Face's LlamaConfig fields,
// so that transformers' LlamaForCausalLM loads an exported file.
type HFConfig struct {
	Architectures         []string `json:"architectures"`
	ModelType             string   `json:"model_type"`
	HiddenSize            int      `json:"hidden_size"`
	IntermediateSize      int      `json:"intermediate_size"`
	NumAttentionHeads     int      `json:"num_attention_heads"`
	NumKeyValueHeads      int      `json:"num_key_value_heads"`
	NumHiddenLayers       int      `json:"num_hidden_layers"`
	RMSNormEps            float64  `json:"rms_norm_eps"`
	RopeTheta             float64  `json:"rope_theta"`
	VocabSize             int      `json:"vocab_size"`
	MaxPositionEmbeddings int      `json:"max_position_embeddings"`
	TieWordEmbeddings     bool     `json:"tie_word_embeddings"`
	TorchDType            string   `json:"torch_dtype"`
	HiddenAct             string   `json:"hidden_act"`
}

// NewHFConfig describes model c with weights of dtype ("float32" or
// "float64").
func NewHFConfig(c nn.GPTConfig, dtype string) HFConfig {
	l := c.Llama
	return HFConfig{Architectures: []string{"LlamaForCausalLM"}, ModelType: "llama", HiddenSize: c.NEmbd,
		IntermediateSize: l.Intermediate, NumAttentionHeads: c.NHead, NumKeyValueHeads: l.NKVHead, NumHiddenLayers: c.NLayer,
		RMSNormEps: l.NormEps, RopeTheta: l.RopeTheta, VocabSize: c.VocabSize, MaxPositionEmbeddings: c.BlockSize,
		TieWordEmbeddings: l.Tied, TorchDType: dtype, HiddenAct: "silu"}
}

// writeHFConfig writes config.json beside the weights file at weights
// (a Llama only; GPT-2 exports are the weights alone).
func writeHFConfig(c nn.GPTConfig, dtype, weights string) error {
	if c.Llama == nil {
		return nil
	}
	b, err := json.MarshalIndent(NewHFConfig(c, dtype), "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(filepath.Dir(weights), "config.json")
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("export: writing %s: %w", path, err)
	}
	return nil
}
