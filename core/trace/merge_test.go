package trace

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// Merge puts two ranks that started 1.5 ms apart on one clock: a span at
// 100 µs on the later rank lands 1600 µs after the earlier rank's zero.
func TestMergeOneClock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run.json")
	for r, start := range []int64{1_000_000_001_500, 1_000_000_000_000} {
		doc := fmt.Sprintf(`{"traceEvents":[{"name":"process_name","ph":"M","pid":%[1]d,"args":{"name":"rank %[1]d"}},`+
			`{"name":"forward","cat":"compute","ph":"X","ts":100,"dur":10,"pid":%[1]d,"tid":0}],"otherData":{"rank":%[1]d,"start_unix_us":%[2]d}}`, r, start)
		require.NoError(t, os.WriteFile(RankPath(path, r), []byte(doc), 0o644))
	}
	require.NoError(t, Merge(path, 2, false))
	ranks, err := ReadRanks(path)
	require.NoError(t, err)
	require.Len(t, ranks, 2)
	require.Equal(t, []Event{
		{Name: "process_name", Ph: "M", PID: 0, Args: map[string]any{"name": "rank 0"}},
		{Name: "forward", Cat: "compute", Ph: "X", TS: 1600, Dur: 10, PID: 0},
	}, ranks[0])
	require.Equal(t, []Event{
		{Name: "process_name", Ph: "M", PID: 1, Args: map[string]any{"name": "rank 1"}},
		{Name: "forward", Cat: "compute", Ph: "X", TS: 100, Dur: 10, PID: 1},
	}, ranks[1])
	require.NoFileExists(t, RankPath(path, 0))

	// A rank's file missing is named.
	require.EqualError(t, Merge(filepath.Join(filepath.Dir(path), "none.json"), 1, false),
		"trace: merging rank 0's trace into "+filepath.Join(filepath.Dir(path), "none.json")+": open "+
			RankPath(filepath.Join(filepath.Dir(path), "none.json"), 0)+": no such file or directory (on several hosts, trace must name a path every host shares)")
}
