package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/trace"
)

// requireMergedTrace holds a run's trace file to one Perfetto/Chrome
// trace with one process track per rank: pid = rank, named "rank N", each
// with its steps' forward, backward and optimizer spans (steps of them)
// and at least one collective.
func requireMergedTrace(t *testing.T, path string, world, steps int) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var doc struct {
		TraceEvents []trace.Event `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(b, &doc), "the merged trace is one JSON object")
	names := map[int]string{}
	spans := map[int]map[string]int{}
	for _, e := range doc.TraceEvents {
		require.GreaterOrEqual(t, e.PID, 0)
		require.Less(t, e.PID, world, "pid %d of a %d-rank run", e.PID, world)
		if e.Ph == "M" && e.Name == "process_name" {
			names[e.PID] = e.Args["name"].(string)
			continue
		}
		if e.Ph == "X" {
			if spans[e.PID] == nil {
				spans[e.PID] = map[string]int{}
			}
			spans[e.PID][e.Cat+" "+e.Name]++
			spans[e.PID]["cat "+e.Cat]++
		}
	}
	for r := range world {
		require.Equal(t, "rank "+string(rune('0'+r)), names[r], "the process track of rank %d", r)
		require.Equal(t, steps, spans[r]["compute optimizer"], "rank %d's optimizer spans", r)
		require.GreaterOrEqual(t, spans[r]["compute forward"], steps, "rank %d's forward spans", r)
		require.GreaterOrEqual(t, spans[r]["compute backward"], steps, "rank %d's backward spans", r)
		require.Positive(t, spans[r]["cat comm"], "rank %d's collectives", r)
	}
	require.Len(t, names, world)
}

// TestTraceMergedLocalRanks: `--trace FILE` under goroutine ranks writes
// one merged file and no per-rank files; trace_per_rank keeps them too.
func TestTraceMergedLocalRanks(t *testing.T) {
	dir := t.TempDir()
	common := []string{"train", "--local-ranks", "2", "--model.n_layer=2", "--model.n_embd=32", "--model.block_size=16",
		"--train.steps=2", "--train.eval_every=0", "--data.val_fraction=0", "--data.max_bytes=100000"}
	tr := filepath.Join(dir, "run.json")
	code, out, errOut := runCLI(append(common, "--trace="+tr)...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "tinyacc: trace written to "+tr+" (one track per rank)\n")
	requireMergedTrace(t, tr, 2, 2)
	for r := range 2 {
		require.NoFileExists(t, trace.RankPath(tr, r))
	}

	tr = filepath.Join(dir, "kept.json")
	code, _, errOut = runCLI(append(common, "--trace="+tr, "--trace_per_rank=true")...)
	require.Equal(t, 0, code, errOut)
	requireMergedTrace(t, tr, 2, 2)
	for r := range 2 {
		ranks, err := trace.ReadRanks(trace.RankPath(tr, r))
		require.NoError(t, err)
		require.Len(t, ranks, r+1, "rank %d's own file holds its track only", r)
		require.NotEmpty(t, ranks[r])
	}
}
