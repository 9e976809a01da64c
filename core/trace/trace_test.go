package trace

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSpansAndFile(t *testing.T) {
	r := New(3)
	outer := r.Begin("backward", "compute", Compute)
	inner := r.Begin("all_reduce", "comm", Comm).With("bytes", 4096)
	inner.End()
	outer.End()
	evs := r.Events()
	require.Len(t, evs, 2)
	require.Equal(t, "all_reduce", evs[0].Name)
	require.Equal(t, 3, evs[0].PID)
	require.Equal(t, Comm, evs[0].TID)
	// The inner span lies within the outer one.
	require.GreaterOrEqual(t, evs[0].TS, evs[1].TS)
	require.LessOrEqual(t, evs[0].TS+evs[0].Dur, evs[1].TS+evs[1].Dur)

	path := RankPath(filepath.Join(t.TempDir(), "run.json"), 3)
	require.Equal(t, "run.rank3.json", filepath.Base(path))
	require.NoError(t, r.WriteFile(path))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var doc struct {
		TraceEvents []Event `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(b, &doc))
	require.Len(t, doc.TraceEvents, 5, "3 metadata events and 2 spans")
	require.Equal(t, float64(4096), doc.TraceEvents[3].Args["bytes"])
}

func TestNilRecorderIsANoOp(t *testing.T) {
	var r *Recorder
	r.Begin("x", "y", Compute).With("k", 1).End()
	require.Nil(t, r.Events())
}
