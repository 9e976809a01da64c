package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func runCLI(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return code, o.String(), e.String()
}

func TestTrainSaveThenSample(t *testing.T) {
	dir := t.TempDir()
	w := filepath.Join(dir, "w.safetensors")
	code, out, errOut := runCLI("train", "--model.n_layer=1", "--model.n_embd=32", "--model.block_size=32",
		"--train.steps=3", "--train.eval_every=0", "--data.max_bytes=100000", "--save_to="+w)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "step 3/3")
	require.Contains(t, out, "eval step 3: val loss")
	require.Contains(t, out, "saved weights to "+w)
	require.Contains(t, out, "memory (MiB)")

	code, out, errOut = runCLI("sample", "--from", w, "--prompt", "func main", "--tokens", "20", "--temperature", "0")
	require.Equal(t, 0, code, errOut)
	require.True(t, strings.HasPrefix(out, "func main"), out)
	require.Equal(t, len("func main")+20, len([]rune(strings.TrimSuffix(out, "\n"))), "prompt plus 20 generated tokens")
}

func TestConfigShowAndErrors(t *testing.T) {
	t.Setenv("TINYACC_TRAIN__LR", "0.002")
	code, out, _ := runCLI("config", "show", "--model.n_layer=3")
	require.Equal(t, 0, code)
	require.Regexp(t, `model\.n_layer\s+3\s+flag --model\.n_layer`, out)
	require.Regexp(t, `train\.lr\s+0\.002\s+env TINYACC_TRAIN__LR`, out)
	require.Regexp(t, `train\.steps\s+300\s+default`, out)

	code, _, errOut := runCLI("train", "--model.n_embd=100", "--model.n_head=3")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "model.n_embd=100 is not divisible by model.n_head=3")

	code, _, errOut = runCLI("frobnicate")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `tinyacc: unknown command "frobnicate"`)

	code, _, errOut = runCLI("sample")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "sample: --from FILE.safetensors is required")
}

func TestBenchCommLocalJSON(t *testing.T) {
	code, out, errOut := runCLI("bench", "comm", "--nproc", "3", "--backend", "local", "--op", "all_reduce",
		"--sizes", "4K,64K", "--iters", "3", "--warmup", "1", "--json")
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2)
	for i, want := range []float64{4096, 65536} {
		var r struct {
			Op     string  `json:"op"`
			NRanks int     `json:"nranks"`
			Bytes  float64 `json:"bytes"`
			TimeMS float64 `json:"time_ms"`
			Alg    float64 `json:"algbw_gbps"`
			Bus    float64 `json:"busbw_gbps"`
		}
		require.NoError(t, json.Unmarshal([]byte(lines[i]), &r))
		require.Equal(t, "all_reduce", r.Op)
		require.Equal(t, 3, r.NRanks)
		require.Equal(t, want, r.Bytes)
		require.InEpsilon(t, r.Bytes/(r.TimeMS/1e3)/1e9, r.Alg, 1e-9)
		require.InEpsilon(t, r.Alg*2*2/3, r.Bus, 1e-9, "all-reduce busbw factor 2(N-1)/N")
	}
}

func TestLaunchFailingRankTakesJobDown(t *testing.T) {
	code, _, errOut := runCLI("launch", "--nproc", "2", "--", "/bin/sh", "-c",
		`if [ "$RANK" = 1 ]; then echo "rank one says bye"; exit 3; fi; exec sleep 30`)
	require.Equal(t, 3, code)
	require.Contains(t, errOut, "launch: rank 1 exited with status 3")
	require.Contains(t, errOut, "rank one says bye")
}

// TestHelpEverywhere: tinyacc --help, -h, and CMD --help / -h print usage
// (the command's own part and where config keys are listed) on stdout and
// exit 0.
func TestHelpEverywhere(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		var out, errb bytes.Buffer
		require.Equal(t, 0, run(args, &out, &errb), "%v", args)
		require.Contains(t, out.String(), "tinyacc train [--config FILE]")
	}
	for _, cmd := range []string{"train", "estimate", "plan", "sample", "config", "export", "ckpt", "bench", "launch", "tokenize", "plot", "version"} {
		for _, flag := range []string{"--help", "-h"} {
			var out, errb bytes.Buffer
			require.Equal(t, 0, run([]string{cmd, flag}, &out, &errb), "%s %s: %s", cmd, flag, errb.String())
			require.Contains(t, out.String(), "Usage:\n  tinyacc "+cmd, "%s %s", cmd, flag)
			require.Contains(t, out.String(), "'tinyacc config show' lists every key", "%s %s", cmd, flag)
			require.Empty(t, errb.String())
		}
	}
}
