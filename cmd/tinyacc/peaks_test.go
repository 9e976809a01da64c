package main

import (
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/trainer"
)

// residentRows are the layouts of the equivalence matrix as real `train`
// jobs of one process per rank, so each rank's rss_peak_bytes is its own;
// the four dimensions at once are 16 processes.
var residentRows = []struct {
	name  string
	flags []string
}{
	{"one process", nil},
	{"ddp dp 2", []string{"--nproc=2"}},
	{"zero-1 dp 2", []string{"--nproc=2", "--zero.stage=1"}},
	{"zero-2 dp 2", []string{"--nproc=2", "--zero.stage=2"}},
	{"zero-3 dp 2", []string{"--nproc=2", "--zero.stage=3"}},
	{"tp 2", []string{"--nproc=2", "--parallel.tp=2"}},
	{"tp 2 + sp", []string{"--nproc=2", "--parallel.tp=2", "--tp.sequence_parallel=true"}},
	{"pp 2 afab", []string{"--nproc=2", "--parallel.pp=2", "--pp.schedule=afab", "--train.grad_accum=2"}},
	{"pp 2 1f1b", []string{"--nproc=2", "--parallel.pp=2", "--pp.schedule=1f1b", "--train.grad_accum=2"}},
	{"pp 2 interleaved", []string{"--nproc=2", "--parallel.pp=2", "--pp.schedule=interleaved", "--pp.virtual_stages=2", "--train.grad_accum=2"}},
	{"pp 2 zb1", []string{"--nproc=2", "--parallel.pp=2", "--pp.schedule=zb1", "--train.grad_accum=2"}},
	{"cp 2", []string{"--nproc=2", "--parallel.cp=2"}},
	{"dp 2 tp 2 pp 2 cp 2", []string{"--nproc=16", "--parallel.dp=2", "--parallel.tp=2", "--parallel.pp=2", "--parallel.cp=2", "--train.grad_accum=2"}},
}

// TestResidentPeakWithinEstimate trains two steps of every layout as
// `tinyacc train` (from the second the gradients are held beside the
// activations, the peak the estimate describes) and holds each rank's
// allocator peak (peak_bytes: construction and the steps, nothing reset) to the estimate of it
// (peak_bytes + setup_peak_bytes of `tinyacc estimate --json`), and
// each process's resident peak (rss_peak_bytes, VmHWM) to the estimate
// of the process, both within 10%.
//
// The estimate of a process adds to its rank's bytes the corpus it holds,
// the shared memory its transport maps (comm.RingBytes: two rings of 2
// MiB and a header page per other process of the host, populated, so
// 60 MiB of each of the 16 processes of the 4D row) and
// trainer.RuntimeBytes (48 MiB), for what else is resident beside the
// allocator's buffers: the binary's pages (about 19 MiB), the Go
// runtime, OpenBLAS's buffers, the segments of the groups' collectives
// and the garbage of the step that the collector has not yet freed (the
// heap limit trainer.LimitHeap sets is the estimate plus 5% plus 32
// MiB). Measured, a rank's resident peak is its allocator peak plus the
// rings plus 26 to 76 MiB: a fixed amount more than a share of the
// model, so the shape gives every rank 120 MiB or more (GPT-2's
// vocabulary, 256 wide, 4 sequences of 64 tokens), where it is within
// the tolerance, and two steps of every layout still take seconds (the
// 16 processes of the 4D row about half a minute on 2 cores).
func TestResidentPeakWithinEstimate(t *testing.T) {
	if testing.Short() {
		t.Skip("trains 13 jobs of a few hundred MiB per rank")
	}
	bin := tinyaccBinary(t)
	dir := t.TempDir()
	corpus := filepath.Join(dir, "corpus.txt")
	require.NoError(t, os.WriteFile(corpus, []byte(strings.Repeat("Every rank holds its own parts, and nothing more. ", 400)), 0o644))
	shape := []string{"--model.n_layer=4", "--model.n_embd=256", "--model.n_head=4", "--model.block_size=64", "--model.vocab_size=50257",
		"--train.batch_size=4", "--train.steps=2", "--train.schedule=constant", "--data.path=" + corpus, "--data.val_fraction=0"}
	for _, row := range residentRows {
		t.Run(row.name, func(t *testing.T) {
			flags := append(append([]string(nil), shape...), row.flags...)
			est := estimateRanks(t, bin, flags)
			metrics := filepath.Join(dir, strings.ReplaceAll(row.name, " ", "_")+".jsonl")
			cmd := exec.Command(bin, append(append([]string{"train"}, flags...), "--metrics_file="+metrics)...)
			cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)
			lines, err := readMetrics(metrics)
			require.NoError(t, err)
			got := map[int]metricLine{}
			for _, l := range lines {
				if l.Kind == "memory" {
					got[l.Rank] = l
				}
			}
			require.Len(t, got, len(est), "memory lines of %s", metrics)
			within := func(what string, r int, measured, want float64) {
				t.Logf("%s rank %d: %s %.1f MiB, estimate %.1f MiB (%+.1f%%)", row.name, r, what, measured/(1<<20), want/(1<<20), 100*(measured/want-1))
				require.LessOrEqual(t, math.Abs(measured-want), 0.10*want, "%s rank %d: %s %.0f B, estimate %.0f B", row.name, r, what, measured, want)
			}
			procs := len(est)
			if len(row.flags) == 0 {
				procs = 1
			}
			for r, e := range est {
				require.Equal(t, int64(trainer.RuntimeBytes), e.Runtime, "the runtime share the estimate adds")
				require.Equal(t, int64(2*(procs-1)*(2<<20+4096)), e.Shared, "the rings of %d processes", procs)
				within("allocator peak", r, got[r].Peak, float64(e.Peak+e.Setup))
				within("rss_peak_bytes", r, got[r].RSS, float64(e.Peak+e.Setup+e.Data+e.Runtime+e.Shared))
			}
		})
	}
}

// rankEstimate is one row of `tinyacc estimate --json`.
type rankEstimate struct {
	Peak    int64 `json:"peak_bytes"`
	Setup   int64 `json:"setup_peak_bytes"`
	Data    int64 `json:"data_bytes"`
	Runtime int64 `json:"runtime_bytes"`
	Shared  int64 `json:"shared_bytes"`
}

// estimateRanks is what `tinyacc estimate --json` says of each rank of
// the run of train flags.
func estimateRanks(t *testing.T, bin string, flags []string) []rankEstimate {
	t.Helper()
	args := append([]string{"estimate", "--json"}, flags...)
	out, err := exec.Command(bin, args...).Output()
	require.NoError(t, err, "%v", args)
	var res []rankEstimate
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var e rankEstimate
		require.NoError(t, json.Unmarshal([]byte(line), &e))
		res = append(res, e)
	}
	return res
}
