package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBenchStepFP16HasNoTorchPeer: fp16 rows time tinyacc only (torch's
// CPU autocast is bf16 only): the table shows "-" in PyTorch's columns,
// the summary says why, and the JSON rows keep every field, 0 for the
// missing peer.
func TestBenchStepFP16HasNoTorchPeer(t *testing.T) {
	args := []string{"--precision", "fp16", "--threads", "1", "--steps", "1", "--warmup", "0", "--repeats", "1",
		"--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--block_size", "8", "--vocab_size", "256", "--batch", "2",
		"--torch-script", "../../bench/torch_step.py", "--python", "/nonexistent/python"}
	var out, errb bytes.Buffer
	require.NoError(t, benchStep(args, &out, &errb))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 3, out.String())
	f := strings.Fields(lines[1])
	require.Len(t, f, 6)
	assert.Equal(t, []string{"1", "fp16", "-", "-"}, []string{f[0], f[1], f[3], f[5]})
	assert.Regexp(t, `^fp16: best tinyacc \(1 threads\) [0-9.]+ ms; no PyTorch peer \(torch's CPU autocast is bf16 only\)$`, lines[2])

	out.Reset()
	require.NoError(t, benchStep(append(args, "--json"), &out, &errb))
	var row map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &row))
	assert.Equal(t, "fp16", row["precision"])
	assert.Equal(t, 0.0, row["pytorch_ms"])
	assert.Equal(t, 0.0, row["ratio_vs_best_pytorch"])
	assert.Greater(t, row["tinyacc_ms"], 0.0)
}

func TestBenchStepRefusesUnknownPrecision(t *testing.T) {
	err := benchStep([]string{"--precision", "fp32,fp8"}, &bytes.Buffer{}, &bytes.Buffer{})
	require.EqualError(t, err, `bench step: --precision "fp32,fp8": want a list of fp32, bf16, bf16-portable, fp16`)
}
