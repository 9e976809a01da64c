package trainer

import (
	"fmt"
	"os"
	"os/exec"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// heapChurnEnv makes the test binary run heapChurn instead of the tests:
// "limit" with LimitHeap, "none" without; "bare" only prints its VmHWM.
const heapChurnEnv = "TINYACC_TEST_HEAP_CHURN"

func TestMain(m *testing.M) {
	switch os.Getenv(heapChurnEnv) {
	case "bare":
		fmt.Println(RSSPeakBytes(), 0)
		return
	case "limit", "none":
		heapChurn(os.Getenv(heapChurnEnv) == "limit")
		return
	}
	os.Exit(m.Run())
}

const (
	churnLive  = 128 << 20 // bytes kept live for the whole run
	churnChunk = 8 << 20   // bytes allocated and dropped at a time
)

// churnSink keeps the latest chunk reachable so the compiler cannot drop
// the allocations.
var churnSink []byte

// heapChurn is a rank's heap in miniature: churnLive bytes live for the
// whole run (parameters, optimizer state) and 512 MiB allocated and dropped
// in chunks (activations, gradients of passing buffers). It prints its
// resident peak (VmHWM).
func heapChurn(limit bool) {
	if limit {
		LimitHeap([]MemoryEstimate{{MemoryReport: MemoryReport{PeakBytes: churnLive}}})
	}
	live := make([]byte, churnLive)
	for i := range live {
		live[i] = byte(i)
	}
	for i := 0; i < (512<<20)/churnChunk; i++ {
		churnSink = make([]byte, churnChunk)
		for j := 0; j < len(churnSink); j += 4096 {
			churnSink[j] = byte(i) // touch every page
		}
	}
	fmt.Println(RSSPeakBytes(), live[len(live)-1])
}

// runChurn runs heapChurn in a fresh process and returns its VmHWM.
func runChurn(t *testing.T, mode string) int64 {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), heapChurnEnv+"="+mode, "GOGC=100")
	out, err := cmd.Output()
	require.NoError(t, err)
	f := strings.Fields(string(out))
	require.Len(t, f, 2, "%q", out)
	rss, err := strconv.ParseInt(f[0], 10, 64)
	require.NoError(t, err)
	return rss
}

// TestLimitHeapBoundsResidentPeak: a process whose estimate is its live
// bytes keeps its resident peak within the estimate plus HeapSlackBytes
// and the bare process's own (the runtime and the binary, measured as the
// peak of a run that allocates nothing), while the same process without
// the limit lets the garbage collector grow its heap to about twice what
// is live (GOGC=100), past that bound.
func TestLimitHeapBoundsResidentPeak(t *testing.T) {
	if RSSPeakBytes() == 0 {
		t.Skip("no /proc/self/status VmHWM here")
	}
	bare := runChurn(t, "bare")
	bound := churnLive + HeapSlackBytes(churnLive) + bare
	limited, free := runChurn(t, "limit"), runChurn(t, "none")
	t.Logf("VmHWM: bare %d MiB, with LimitHeap %d MiB (bound %d MiB), without %d MiB", bare>>20, limited>>20, bound>>20, free>>20)
	require.LessOrEqual(t, limited, bound, "resident peak with the heap bounded")
	require.Greater(t, free, bound, "without the bound the heap should outgrow it (else this test shows nothing)")
}

// TestLimitHeapLeavesGOMEMLIMIT: a limit given in the environment wins.
func TestLimitHeapLeavesGOMEMLIMIT(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(old)
	t.Setenv("GOMEMLIMIT", "1GiB")
	require.Equal(t, int64(0), LimitHeap([]MemoryEstimate{{MemoryReport: MemoryReport{PeakBytes: 1 << 20}}}))
	require.Equal(t, old, debug.SetMemoryLimit(-1))
	os.Unsetenv("GOMEMLIMIT")
	e := MemoryEstimate{MemoryReport: MemoryReport{PeakBytes: 100 << 20}, RuntimeBytes: RuntimeBytes}
	want := e.ProcessBytes() + (e.ProcessBytes()/10+64<<20)/2
	require.Equal(t, want, LimitHeap([]MemoryEstimate{e}))
	require.Equal(t, want, debug.SetMemoryLimit(-1))
}
