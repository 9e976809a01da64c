package cpu

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParallelForCoversEachIndexOnce(t *testing.T) {
	for _, threads := range []int{1, 2, 3, 7} {
		for _, n := range []int{0, 1, 5, 100, 1001} {
			for _, grain := range []int{0, 1, 7, 2000} {
				withThreads(threads, func() {
					hits := make([]int32, n)
					var chunks atomic.Int32
					ParallelFor(n, grain, func(lo, hi int) {
						// assert, not require: this may run on a pool worker.
						assert.Less(t, lo, hi)
						if grain > 0 && n >= grain {
							assert.GreaterOrEqual(t, hi-lo, grain, "chunk below the grain")
						}
						chunks.Add(1)
						for i := lo; i < hi; i++ {
							atomic.AddInt32(&hits[i], 1)
						}
					})
					for i, h := range hits {
						require.EqualValues(t, 1, h, "index %d (threads=%d n=%d grain=%d)", i, threads, n, grain)
					}
					require.LessOrEqual(t, int(chunks.Load()), max(threads, 1))
				})
			}
		}
	}
}

func TestParallelForNestedAndConcurrent(t *testing.T) {
	// Nested calls and calls from many goroutines at once must neither
	// deadlock nor lose work when every worker is busy.
	withThreads(4, func() {
		var total atomic.Int64
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ParallelFor(16, 1, func(lo, hi int) {
					for i := lo; i < hi; i++ {
						ParallelFor(100, 1, func(lo, hi int) { total.Add(int64(hi - lo)) })
					}
				})
			}()
		}
		wg.Wait()
		require.EqualValues(t, 8*16*100, total.Load())
	})
}

func TestSetThreads(t *testing.T) {
	withThreads(3, func() { require.Equal(t, 3, Threads()) })
	withThreads(0, func() { require.Equal(t, 1, Threads(), "values below 1 mean 1") })
}
