package main

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
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

// TestBenchStepRatiosRunByRun: the precisions run in turn within each
// repeat, and the last line gives fp16's tokens/s against fp32's of the
// same repeat (the ratio of the two step times that repeat printed, to
// their rounding) and the median of the three.
func TestBenchStepRatiosRunByRun(t *testing.T) {
	if exec.Command("/usr/bin/python3", "-c", "import torch").Run() != nil {
		t.Skip("/usr/bin/python3 has no torch (make deps installs it)")
	}
	args := []string{"--precision", "fp32,fp16", "--threads", "1", "--steps", "1", "--warmup", "0", "--repeats", "3",
		"--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--block_size", "8", "--vocab_size", "256", "--batch", "2",
		"--torch-script", "../../bench/torch_step.py"}
	var out, errb bytes.Buffer
	require.NoError(t, benchStep(args, &out, &errb))
	var order []string
	ms := map[string][]float64{}
	for _, m := range regexp.MustCompile(`threads 1 (fp32|fp16) run (\d): tinyacc ([0-9.]+) ms/step`).FindAllStringSubmatch(errb.String(), -1) {
		order = append(order, m[1]+" "+m[2])
		ms[m[1]] = append(ms[m[1]], parseF(t, m[3]))
	}
	require.Equal(t, []string{"fp32 1", "fp16 1", "fp32 2", "fp16 2", "fp32 3", "fp16 3"}, order, errb.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	last := regexp.MustCompile(`^tinyacc fp16 vs fp32 \(1 threads\), run by run: ([0-9.]+), ([0-9.]+), ([0-9.]+) tokens/s, median ([0-9.]+)x$`).
		FindStringSubmatch(lines[len(lines)-1])
	require.NotNil(t, last, out.String())
	var got []float64
	for r := range 3 {
		v, f32, f16 := parseF(t, last[r+1]), ms["fp32"][r], ms["fp16"][r]
		// the progress lines round the step times to 0.1 ms, the ratio to 0.01
		lo, hi := (f32-0.05)/(f16+0.05)-0.005, (f32+0.05)/max(f16-0.05, 0.001)+0.005
		assert.True(t, v >= lo && v <= hi, "repeat %d: ratio %v, but %v ms / %v ms is in [%v, %v]", r+1, v, f32, f16, lo, hi)
		got = append(got, v)
	}
	sort.Float64s(got)
	assert.Equal(t, got[1], parseF(t, last[4]), "the median of %v", got)
}

func parseF(t *testing.T, s string) float64 {
	v, err := strconv.ParseFloat(s, 64)
	require.NoError(t, err)
	return v
}
