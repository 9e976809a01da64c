package main

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// `tinyacc bench cp` runs its layouts as processes and prints the counted
// attention FLOPs per rank: equal under zigzag, (c(c+1)/2 + c²)/(c(c+1)/2)
// = 100/36 apart under the contiguous split of 16 tokens over 2 ranks
// (chunks of c = 8), with the overlap and memory sections after them. The
// overlap section's figures are held to their definition: per rank, the
// hidden time is part of the transfer time and the share is their ratio;
// the "all" row sums the ranks.
func TestBenchCP(t *testing.T) {
	bin := tinyaccBinary(t)
	cmd := exec.Command(bin, "bench", "cp", "--nproc", "2", "--steps", "2", "--repeats", "1",
		"--n_layer", "1", "--n_embd", "32", "--block_size", "16", "--batch", "2")
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "%s", stderr.String())
	s := stdout.String()
	require.Contains(t, s, "\nzigzag      max/min: FLOPs 1.000, ", s)
	require.Contains(t, s, "\ncontiguous  max/min: FLOPs 2.778, ", s)
	require.Contains(t, s, "\noverlap: cp 2 ring, 2 processes", s)
	for _, row := range []string{"cp 2 ring zigzag ", "cp 2 ring contiguous ", "cp 2 ring ", "cp 2 allgather "} {
		require.True(t, strings.Contains(s, "\n"+row), "no %q row:\n%s", row, s)
	}
	requireHiddenShares(t, s)
}

// requireHiddenShares checks the rows of bench cp's overlap section.
func requireHiddenShares(t *testing.T, out string) {
	t.Helper()
	head := "\nrank  transfer ms    hidden ms    hidden\n"
	i := strings.Index(out, head)
	require.GreaterOrEqual(t, i, 0, "no overlap table:\n%s", out)
	row := regexp.MustCompile(`^ *(\d+|all) +(\d+\.\d\d) +(\d+\.\d\d) +(\d+\.\d)%$`)
	var sumT, sumH float64
	lines := strings.Split(out[i+len(head):], "\n")
	for k, want := range []string{"0", "1", "all"} {
		m := row.FindStringSubmatch(lines[k])
		require.NotNil(t, m, "overlap row %q: %q", want, lines[k])
		require.Equal(t, want, m[1])
		tr, _ := strconv.ParseFloat(m[2], 64)
		hid, _ := strconv.ParseFloat(m[3], 64)
		pct, _ := strconv.ParseFloat(m[4], 64)
		require.Positive(t, tr, "rank %s moved no ring transfer", want)
		require.LessOrEqual(t, hid, tr, "rank %s: hidden within the transfer time", want)
		// Printed to 0.01 ms and 0.1%: the share agrees up to that rounding.
		require.InDelta(t, 100*hid/tr, pct, 0.05+100*0.01/tr, "rank %s: hidden share", want)
		if want == "all" {
			require.InDelta(t, sumT, tr, 0.02, "all: transfer ms")
			require.InDelta(t, sumH, hid, 0.02, "all: hidden ms")
		}
		sumT, sumH = sumT+tr, sumH+hid
	}
}

// `tinyacc train --local-ranks 16` on the full 4D mesh (dp 2, tp 2, pp 2,
// cp 2) logs the losses of one process with the same global batch.
func TestTrain4DLocalRanks(t *testing.T) {
	dir := t.TempDir()
	bin := tinyaccBinary(t)
	common := []string{"train", "--model.n_layer=2", "--model.n_embd=32", "--model.block_size=16",
		"--train.steps=3", "--train.eval_every=0", "--data.max_bytes=200000", "--data.val_fraction=0"}
	run := func(name string, extra ...string) []float64 {
		return trainLosses(t, trainRun(t, bin, dir, name, append(append([]string{}, common...), extra...)...))
	}
	want := run("single", "--train.batch_size=8")
	got := run("4d", "--local-ranks", "16", "--parallel.dp=2", "--parallel.tp=2", "--parallel.pp=2", "--parallel.cp=2", "--train.batch_size=4")
	require.Len(t, got, len(want))
	for i := range want {
		require.InEpsilon(t, want[i], got[i], 1e-5, "loss of step %d", i)
	}
}
