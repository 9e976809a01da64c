package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/plugins"
	"github.com/tinyacc/tinyacc/plugins/plan"
)

const planProfile = "../../plugins/plan/testdata/profile.json"

// planModel is a tiny model whose 4-rank layouts a memory limit splits:
// its layouts need 63 to 80 MiB a rank, the 12 MiB of shared-memory
// rings each of 4 processes maps included.
var planModel = []string{"--model.n_layer=4", "--model.n_head=4", "--model.n_embd=64", "--model.block_size=32",
	"--model.vocab_size=4096", "--train.batch_size=8", "--data.max_bytes=100000"}

// trainAccepts is what train checks before any work, for `train --nproc
// n` with flags: the config loads and validates, and the layout and the
// memory estimate pass checkBeforeWork.
func trainAccepts(flags []string, n int) error {
	r, err := loadConfig(flags)
	if err != nil {
		return err
	}
	return checkBeforeWork(r.Config, n, n, n, io.Discard)
}

// Every layout plan prints is one train accepts with the printed flags;
// every layout of the search that train refuses (by its config, its
// layout or memory.limit) is left out; the exclusion lines' counts and
// the printed layouts add up to the layouts enumerated.
func TestPlanPrintsWhatTrainAccepts(t *testing.T) {
	limit := "--memory.limit=" + strconv.Itoa(4*68<<20) // 68 MiB per rank
	args := append([]string{"plan", "--nproc", "4", "--top", "100000", "--json", "--profile", planProfile, limit}, planModel...)
	code, out, errOut := runCLI(args...)
	require.Equal(t, 0, code, errOut)
	printed := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var row planRow
		require.NoError(t, json.Unmarshal([]byte(line), &row))
		require.NoError(t, trainAccepts(row.Flags, 4), "%s", row.Layout)
		printed[strings.Join(row.Flags, " ")] = true
	}
	excluded := 0
	memory := 0
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	require.Contains(t, lines[0], "was made on another machine (host \"golden\"")
	for _, line := range lines[1:] {
		m := regexp.MustCompile(`^(\d+) layouts? (.*)$`).FindStringSubmatch(line)
		require.NotNil(t, m, "an exclusion line: %q", line)
		n, _ := strconv.Atoi(m[1])
		excluded += n
		if strings.HasPrefix(m[2], "need > 68.0 MiB per rank") {
			memory = n
		}
	}
	require.Positive(t, memory, errOut)

	r, err := loadConfig(append([]string{limit}, planModel...))
	require.NoError(t, err)
	all := plugins.Layouts(r.Config, 4, plugins.PlanDims(8))
	require.Equal(t, len(all), len(printed)+excluded)
	refused := 0
	for _, l := range all {
		flags := append([]string{limit}, planModel...)
		for _, kv := range l.Flags {
			flags = append(flags, "--"+kv)
		}
		key := strings.Join(flags, " ")
		if l.Err != nil || trainAccepts(flags, 4) != nil {
			refused++
			require.False(t, printed[key], "train refuses %s, plan printed it", key)
		} else {
			require.True(t, printed[key], "train accepts %s, plan left it out", key)
		}
	}
	require.Equal(t, excluded, refused)
}

// plan --verify 2 on a tiny model over 2 processes: the table has the top
// 2 and 2 more, predicted against measured, then the Spearman line, the
// median error and the first choice; each measured column is what the
// run's own metrics file says (the median step_ms of steps 3 to 5, the
// largest allocator and resident peaks of its ranks), and the predicted
// peak is the allocator's as `tinyacc estimate --json` gives it for the
// layout's flags (the largest peak_bytes + setup_peak_bytes of its
// ranks), not the process's need, so that the two peaks are alike.
func TestPlanVerify(t *testing.T) {
	bin := tinyaccBinary(t)
	keep := t.TempDir()
	model := []string{"--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", "--model.block_size=16", "--model.vocab_size=256",
		"--train.batch_size=4", "--data.max_bytes=100000", "--memory.limit=0"}
	args := append([]string{"plan", "--nproc", "2", "--verify", "2", "--keep", keep, "--profile", planProfile}, model...)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "%s", stderr.String())
	out := stdout.String()
	_, table, ok := strings.Cut(out, "verify: 5 steps per layout (the first 2 not timed), 2 processes each\n")
	require.True(t, ok, out)
	lines := strings.Split(strings.TrimSpace(table), "\n")
	require.Len(t, lines, 1+4+3, table)
	require.Equal(t, []string{"#", "layout", "pred", "ms", "meas", "ms", "error", "pred", "alloc", "meas", "alloc", "meas", "rss"}, strings.Fields(lines[0]))

	// Each layout's flags by its name, as plan --json prints them.
	code, js, errOut := runCLI(append([]string{"plan", "--nproc", "2", "--json", "--top", "100000", "--profile", planProfile}, model...)...)
	require.Equal(t, 0, code, errOut)
	flags := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(js), "\n") {
		var r planRow
		require.NoError(t, json.Unmarshal([]byte(line), &r))
		flags[r.Layout] = r.Flags
	}
	row := regexp.MustCompile(`^(\d) +(.+?) +([\d.]+) +([\d.]+) +[+-]\d+% +([\d.]+ [KMG]iB) +([\d.]+ [KMG]iB) +([\d.]+ [KMG]iB)$`)
	for i, line := range lines[1:5] {
		m := row.FindStringSubmatch(line)
		require.NotNil(t, m, "row %q", line)
		require.Equal(t, strconv.Itoa(i+1), m[1])
		got, err := readMetrics(filepath.Join(keep, fmt.Sprintf("verify-%d.jsonl", i+1)))
		require.NoError(t, err)
		var steps []float64
		var alloc, rss float64
		for _, l := range got {
			if l.Kind == "train" && l.Step >= 3 {
				steps = append(steps, l.StepMS)
			}
			if l.Kind == "memory" {
				alloc, rss = max(alloc, l.Peak), max(rss, l.RSS)
			}
		}
		slices.Sort(steps)
		require.Len(t, steps, 3)
		require.Equal(t, fmt.Sprintf("%.1f", steps[1]), m[4], line)
		require.Equal(t, fmt.Sprintf("%.1f MiB", alloc/(1<<20)), m[6], line)
		require.Equal(t, fmt.Sprintf("%.1f MiB", rss/(1<<20)), m[7], line)

		f, ok := flags[m[2]]
		require.True(t, ok, "plan --json names %q", m[2])
		code, est, errOut := runCLI(append([]string{"estimate", "--json", "--nproc", "2"}, f...)...)
		require.Equal(t, 0, code, errOut)
		var pred int64
		for _, l := range strings.Split(strings.TrimSpace(est), "\n") {
			var e struct {
				Peak  int64 `json:"peak_bytes"`
				Setup int64 `json:"setup_peak_bytes"`
			}
			require.NoError(t, json.Unmarshal([]byte(l), &e))
			pred = max(pred, e.Peak+e.Setup)
		}
		require.Equal(t, fmt.Sprintf("%.1f MiB", float64(pred)/(1<<20)), m[5], line)
	}
	require.Regexp(t, `^Spearman: -?[\d.]+$`, lines[5])
	require.Regexp(t, `^median absolute error: [\d.]+%$`, lines[6])
	require.Regexp(t, `^first choice: .+, [\d.]+ ms measured; fastest measured: .+, [\d.]+ ms \([+-][\d.]+%\)$`, lines[7])
}

// plan calibrate writes a profile of this machine that plan reads without
// a word; a profile that is not there is said to be missing, and plan
// goes on with its guess.
func TestPlanCalibrateWritesWhatPlanReads(t *testing.T) {
	bin := tinyaccBinary(t)
	prof := filepath.Join(t.TempDir(), "p.json")
	out, err := exec.Command(bin, "plan", "calibrate", "--profile", prof, "--nproc", "2").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "wrote the profile of")
	p, err := plan.Load(prof)
	require.NoError(t, err)
	require.Empty(t, p.Elsewhere(plan.ThisHost()))
	require.Len(t, p.Efficiency, 2)
	for i, e := range p.Efficiency {
		require.Equal(t, i+1, e.Ranks)
		require.Positive(t, e.Share)
	}
	ops := map[string]bool{}
	for _, c := range p.Collectives {
		require.Equal(t, 2, c.N)
		require.Positive(t, c.BusBW)
		ops[c.Op] = true
	}
	require.Len(t, ops, len(calibOps))
	require.True(t, ops["all_to_all"], "expert parallel's exchange is priced from it: %v", ops)

	tiny := []string{"--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", "--model.block_size=16", "--memory.limit=0"}
	code, stdout, stderr := runCLI(append([]string{"plan", "--nproc", "2", "--profile", prof}, tiny...)...)
	require.Equal(t, 0, code, stderr)
	require.Empty(t, stderr)
	require.Contains(t, stdout, "layouts of 2 ranks")

	missing := filepath.Join(t.TempDir(), "none.json")
	code, _, stderr = runCLI(append([]string{"plan", "--nproc", "2", "--profile", missing}, tiny...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "tinyacc: plan: no profile at "+missing+": predicting from train.peak_flops")
}

// The contended latency's measurement on 3 ranks: the pair times its
// rounds while the third multiplies matrices until rank 0 tells it the
// pair is done, for both runs, and ends with the others (a rank that
// missed the word would never return); only the pair measures.
func TestMeasureContendedStopsTheOthers(t *testing.T) {
	got := make([]float64, 3)
	err := comm.RunLocal(3, comm.Options{}, func(g comm.Group) error {
		c, err := measureContended(g)
		got[g.Rank()] = c
		return err
	})
	require.NoError(t, err)
	require.GreaterOrEqual(t, got[0], 0.0)
	require.Zero(t, got[2])
}

// A collective's latency and bus bandwidth come back from its times at
// calibSizes when they follow latency + bytes·factor/bandwidth: the
// bandwidth from the slope between the two larger sizes, the latency
// from the smallest; where the largest took no longer than the middle
// one (a hiccup at 1 MiB), the largest's whole time gives the bandwidth.
func TestPlanFitCollective(t *testing.T) {
	const lat, bw, f = 1e-4, 2e9, 1.5
	var times [3]float64
	for i, s := range calibSizes {
		times[i] = lat + f*float64(s)/bw
	}
	gotLat, gotBW := fitCollective(f, times)
	require.InDelta(t, lat, gotLat, 1e-12)
	require.InDelta(t, bw, gotBW, 1e-3)
	times[1] = times[2] + 1e-3
	_, gotBW = fitCollective(f, times)
	require.InDelta(t, f*float64(calibSizes[2])/times[2], gotBW, 1e-3)
}
