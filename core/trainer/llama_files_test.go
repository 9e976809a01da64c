package trainer_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// A Llama's checkpoint exports to the file save_to writes at the same
// step, byte for byte, with a config.json of Hugging Face's LlamaConfig
// fields beside it; init_from of the export gives back every weight
// bitwise, untied lm_head included.
func TestLlamaExportInitFromRoundTrip(t *testing.T) {
	for _, tied := range []bool{false, true} {
		cfg := ptest.Llama64()
		cfg.Model.TieEmbeddings = tied
		cfg.Train.Steps = 2
		cfg.Checkpoint.Dir = t.TempDir()
		cfg.SaveTo = filepath.Join(t.TempDir(), "saved.safetensors")
		tr, err := trainer.New(cfg, trainer.Options{Train: ptest.Corpus()})
		require.NoError(t, err)
		_, err = tr.Run(context.Background())
		require.NoError(t, err)

		out := filepath.Join(t.TempDir(), "hf", "model.safetensors")
		require.NoError(t, trainer.ExportCheckpoint(filepath.Join(cfg.Checkpoint.Dir, ckpt.StepDir(2)), out))
		saved, err := os.ReadFile(cfg.SaveTo)
		require.NoError(t, err)
		exported, err := os.ReadFile(out)
		require.NoError(t, err)
		require.True(t, bytes.Equal(saved, exported), "tied=%v: the export is the file save_to wrote", tied)

		b, err := os.ReadFile(filepath.Join(filepath.Dir(out), "config.json"))
		require.NoError(t, err)
		var hf map[string]any
		require.NoError(t, json.Unmarshal(b, &hf))
		require.Equal(t, map[string]any{
			"architectures": []any{"LlamaForCausalLM"}, "model_type": "llama", "hidden_size": 64.0, "intermediate_size": 96.0,
			"num_attention_heads": 4.0, "num_key_value_heads": 2.0, "num_hidden_layers": 4.0, "rms_norm_eps": 1e-5,
			"rope_theta": 10000.0, "vocab_size": 259.0, "max_position_embeddings": 16.0, "tie_word_embeddings": tied,
			"torch_dtype": "float64", "hidden_act": "silu",
		}, hf)

		back := cfg
		back.InitFrom, back.SaveTo, back.Checkpoint.Dir = out, "", ""
		m, err := trainer.BuildModel(back, nil)
		require.NoError(t, err)
		require.Equal(t, len(tr.Model.Params()), len(m.Params()))
		names := map[string]bool{}
		for _, p := range tr.Model.Params() {
			q := m.Param(p.Name)
			require.NotNil(t, q, p.Name)
			require.Equal(t, p.Float64s(), q.Float64s(), "tied=%v: %s after export and init_from", tied, p.Name)
			names[p.Name] = true
		}
		require.Equal(t, !tied, names["lm_head.weight"], "an lm_head of its own exactly when untied")
	}
}
