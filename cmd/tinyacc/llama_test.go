package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A Llama trains from flags, checkpoints, exports with its config.json
// and samples from the export.
func TestLlamaTrainExportSample(t *testing.T) {
	dir := t.TempDir()
	code, out, errOut := runCLI("train", "--model.arch=llama", "--model.n_kv_head=1", "--model.n_layer=1", "--model.n_head=2",
		"--model.n_embd=32", "--model.block_size=32", "--train.steps=2", "--train.eval_every=0", "--data.max_bytes=100000",
		"--checkpoint.dir="+filepath.Join(dir, "ck"))
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "step 2/2")
	w := filepath.Join(dir, "hf", "model.safetensors")
	code, out, errOut = runCLI("export", "--from", filepath.Join(dir, "ck"), "--to", w)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "config.json beside it")
	b, err := os.ReadFile(filepath.Join(dir, "hf", "config.json"))
	require.NoError(t, err)
	var hf struct {
		Heads   int `json:"num_attention_heads"`
		KVHeads int `json:"num_key_value_heads"`
	}
	require.NoError(t, json.Unmarshal(b, &hf))
	require.Equal(t, [2]int{2, 1}, [2]int{hf.Heads, hf.KVHeads})
	code, out, errOut = runCLI("sample", "--from", w, "--prompt", "func main", "--tokens", "10", "--temperature", "0")
	require.Equal(t, 0, code, errOut)
	require.True(t, strings.HasPrefix(out, "func main"), out)
	require.Greater(t, len(out), len("func main\n"), "sample continues the prompt")

	code, _, errOut = runCLI("train", "--model.n_kv_head=2")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "config: model.n_kv_head=2 is a llama key, but model.arch=gpt2: drop model.n_kv_head or set model.arch=llama")
	code, _, errOut = runCLI("train", "--model.arch=llama", "--model.n_kv_head=1", "--parallel.tp=2", "--nproc=2")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "config: model.n_kv_head=1 is not divisible by parallel.tp=2")
}
