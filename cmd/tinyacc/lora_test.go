package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLoRACommands: a base saved by a short run, adapters trained on it
// into a checkpoint, then `export --lora` (a PEFT adapter directory) and
// `export --merge-lora` (the base with them merged); a plain export and
// a bad flag combination say what to do.
func TestLoRACommands(t *testing.T) {
	dir := t.TempDir()
	base, ck := filepath.Join(dir, "base.safetensors"), filepath.Join(dir, "ckpt")
	shape := []string{"--model.n_layer=1", "--model.n_embd=32", "--model.block_size=32", "--train.eval_every=0", "--data.max_bytes=100000"}
	code, _, errOut := runCLI(append([]string{"train", "--train.steps=2", "--save_to=" + base}, shape...)...)
	require.Equal(t, 0, code, errOut)
	adapters := filepath.Join(dir, "adapters.safetensors")
	code, out, errOut := runCLI(append([]string{"train", "--train.steps=2", "--init_from=" + base, "--lora.rank=4", "--checkpoint.dir=" + ck, "--save_to=" + adapters}, shape...)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "step 2/2")
	code, _, errOut = runCLI("sample", "--from", adapters)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "holds LoRA adapters, not a model (save_to of a run with lora.rank > 0): sample from its base with the adapters merged in")

	code, out, errOut = runCLI("ckpt", "inspect", ck)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `LoRA adapters of the base with SHA-256 [0-9a-f]{64} \(export with --lora or --merge-lora\)`, out)
	require.Contains(t, out, "h.0.attn.c_attn.lora_B.weight")
	require.NotContains(t, out, "wte.weight")

	peft := filepath.Join(dir, "peft")
	code, out, errOut = runCLI("export", "--lora", "--from", ck, "--to", peft)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "adapter_model.safetensors, adapter_config.json")
	for _, f := range []string{"adapter_model.safetensors", "adapter_config.json"} {
		_, err := os.Stat(filepath.Join(peft, f))
		require.NoError(t, err, f)
	}
	merged := filepath.Join(dir, "merged.safetensors")
	code, _, errOut = runCLI("export", "--merge-lora", "--from", ck, "--to", merged)
	require.Equal(t, 0, code, errOut)
	code, out, errOut = runCLI("sample", "--from", merged, "--prompt", "func", "--tokens", "4", "--temperature", "0")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "func")

	code, _, errOut = runCLI("export", "--from", ck, "--to", filepath.Join(dir, "plain.safetensors"))
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "holds LoRA adapters, not a model: export them with --lora (a PEFT adapter directory) or --merge-lora")
	code, _, errOut = runCLI("export", "--lora", "--merge-lora", "--from", ck, "--to", peft)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "tinyacc export --lora --from CHECKPOINT --to DIR")
}
