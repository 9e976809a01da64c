package main

import (
	"html"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPPDraw(t *testing.T) {
	code, out, errOut := runCLI("pp", "draw", "--pp", "4", "--micro", "8", "--schedule", "1f1b")
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 5)
	require.Equal(t, "rank 3 | .  .  .  F0 B0 B0 F1 B1 B1 F2 B2 B2 F3 B3 B3 F4 B4 B4 F5 B5 B5 F6 B6 B6 F7 B7 B7 .  .  .  .  .  .", lines[3])
	require.Equal(t, "bubble ratio (idle ÷ compute): 0.375 (formula (p-1)/m = 0.375); idle share of wall time: 0.273 (formula (p-1)/(m+p-1) = 0.273)", lines[4])

	svg := filepath.Join(t.TempDir(), "zb1.svg")
	code, out, errOut = runCLI("pp", "draw", "--pp", "4", "--micro", "8", "--schedule", "zb1", "--svg", svg)
	require.Equal(t, 0, code, errOut)
	bubble := "bubble ratio (idle ÷ compute): 0.125 (formula (p-1)/(3m) = 0.125); idle share of wall time: 0.111 (formula b/(1+b), b = (p-1)/(3m) = 0.111)"
	require.Equal(t, bubble+"\ntinyacc: wrote the timeline, its legend and the bubble to "+svg+"\n", out[strings.Index(out, "bubble ratio"):])
	b, err := os.ReadFile(svg)
	require.NoError(t, err)
	require.Equal(t, 1+4*8*3+3, strings.Count(string(b), "<rect "), "the background, one box per F, B and W, three in the legend")
	for _, l := range []string{">F forward<", ">B backward<", ">W weight gradient<", ">blank: idle<", ">zb1 schedule, p=4 m=8: " + html.EscapeString(bubble) + "<"} {
		require.Contains(t, string(b), l)
	}

	// Every label fits its box (monospace at 11px: under 7px a character).
	svg = filepath.Join(t.TempDir(), "il.svg")
	code, _, errOut = runCLI("pp", "draw", "--pp", "4", "--micro", "8", "--schedule", "interleaved", "--virtual", "2", "--svg", svg)
	require.Equal(t, 0, code, errOut)
	b, err = os.ReadFile(svg)
	require.NoError(t, err)
	boxes := regexp.MustCompile(`<rect x="[0-9.]+" y="[0-9.]+" width="([0-9.]+)" height="[0-9.]+" fill="#[0-9a-f]+" stroke="#333"/>\n<text x="[0-9.]+" y="[0-9.]+">([^<]+)</text>`).FindAllStringSubmatch(string(b), -1)
	require.Equal(t, 4*8*2*2, len(boxes), "one box per F and B of each chunk")
	for _, m := range boxes {
		w, err := strconv.ParseFloat(m[1], 64)
		require.NoError(t, err)
		require.LessOrEqual(t, 3+7*float64(len(m[2])), w, "label %q in a box %s wide", m[2], m[1])
	}

	code, _, errOut = runCLI("pp", "draw", "--pp", "4", "--micro", "6", "--schedule", "interleaved", "--virtual", "2")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "pp: the interleaved schedule needs train.grad_accum (micro-batches, 6) to be a multiple of parallel.pp (4)")
}

// TestPPDrawTrace: a pipeline run's trace draws as the same timeline, one
// row per rank, with its measured bubble.
func TestPPDrawTrace(t *testing.T) {
	tr := filepath.Join(t.TempDir(), "run.json")
	code, _, errOut := runCLI("train", "--local-ranks", "2", "--parallel.pp=2", "--pp.schedule=zb1", "--model.n_layer=2",
		"--model.n_embd=32", "--model.block_size=16", "--train.steps=2", "--train.grad_accum=2", "--train.eval_every=0",
		"--data.val_fraction=0", "--data.max_bytes=100000", "--trace="+tr)
	require.Equal(t, 0, code, errOut)
	code, out, errOut := runCLI("pp", "draw", "--trace", tr)
	require.Equal(t, 0, code, errOut)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 3)
	require.True(t, strings.HasPrefix(lines[0], "rank 0 | F0"), lines[0])
	require.True(t, strings.HasPrefix(lines[1], "rank 1 | ."), lines[1])
	require.Regexp(t, `^one cell = \d+ µs \(the shortest forward\); measured bubble ratio \(idle ÷ compute\): \d+\.\d{3,} \(formula \(p-1\)/\(3m\) = 0\.167\); idle share of wall time: \d+\.\d{3,} \(formula b/\(1\+b\), b = \(p-1\)/\(3m\) = 0\.143\)$`, lines[2])
}
