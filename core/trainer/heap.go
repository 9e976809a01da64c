package trainer

import (
	"os"
	"runtime/debug"
)

// HeapSlackBytes is what a process may hold beyond the estimate of the
// ranks it runs once LimitHeap has bounded its heap: a tenth of the
// estimate plus 64 MiB. Half of it is the collector's room (the limit
// LimitHeap sets is the estimate plus half of this); the other half is
// for what a collection cycle lets in before it frees (the buffers
// allocated while it runs) and the runtime's own structures. The resident
// peak (rss_peak_bytes) is then at most the estimate plus this, plus the
// memory of a process that allocates nothing (the binary's pages).
func HeapSlackBytes(estimate int64) int64 { return estimate/10 + 64<<20 }

// LimitHeap bounds the Go runtime's memory to the estimate of the ranks
// this process runs (one, or several goroutine ranks; less the shared
// memory its transport maps, which is not the heap's) plus half of
// HeapSlackBytes, with runtime/debug.SetMemoryLimit. Without it the
// collector lets the heap grow to twice what is live before it runs
// (GOGC=100), so a rank whose live bytes are the estimate could reach
// twice it in resident memory; with it, the collector runs as the heap
// nears the limit and returns freed pages to the kernel. A GOMEMLIMIT in
// the environment wins: LimitHeap then leaves the limit alone. It returns
// the limit it set, 0 if none.
func LimitHeap(es []MemoryEstimate) int64 {
	if _, ok := os.LookupEnv("GOMEMLIMIT"); ok || len(es) == 0 {
		return 0
	}
	var sum int64
	for _, e := range es {
		sum += e.ProcessBytes() - e.SharedBytes // mapped memory is not the collector's
	}
	limit := sum + HeapSlackBytes(sum)/2
	debug.SetMemoryLimit(limit)
	return limit
}
