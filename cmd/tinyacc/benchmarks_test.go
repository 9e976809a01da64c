package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHelpListsEveryBenchmark: `tinyacc --help` and `tinyacc bench --help`
// show a block for each of the benchmarks, and every bench function of
// this package (func benchX(args, stdout, stderr) error) is in the table
// they are drawn from.
func TestHelpListsEveryBenchmark(t *testing.T) {
	want := []string{"step", "comm", "dp", "layouts", "ep", "pp", "cp", "soak", "ckpt", "process", "memory", "precision", "torch", "recompute", "lora"}
	for _, args := range [][]string{{"--help"}, {"bench", "--help"}} {
		var out, errb bytes.Buffer
		require.Equal(t, 0, run(args, &out, &errb), "%v", args)
		for _, name := range want {
			require.Contains(t, out.String(), "\n  tinyacc bench "+name+" [", "%v lacks bench %s", args, name)
		}
		require.Equal(t, len(benchmarks), strings.Count(out.String(), "\n  tinyacc bench "), "%v", args)
	}
	var errb bytes.Buffer
	require.Equal(t, 1, run([]string{"bench", "nope"}, &bytes.Buffer{}, &errb))
	require.Equal(t, "tinyacc: bench: unknown benchmark \"nope\" (have: "+strings.Join(want, ", ")+")\n", errb.String())

	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	decl := regexp.MustCompile(`(?m)^func (bench[A-Z]\w*)\(args \[\]string, stdout, stderr io\.Writer\) error`)
	registered := map[string]bool{}
	src, err := os.ReadFile("benchmarks.go")
	require.NoError(t, err)
	for _, m := range regexp.MustCompile(`, (bench[A-Z]\w*)},`).FindAllStringSubmatch(string(src), -1) {
		registered[m[1]] = true
	}
	found := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range decl.FindAllStringSubmatch(string(b), -1) {
			found++
			require.True(t, registered[m[1]], "%s (%s) is not in the benchmarks table", m[1], f)
		}
	}
	require.Equal(t, len(want), found)
}
