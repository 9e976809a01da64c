package main

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
)

// localRunners wraps each goroutine rank's group in a runner with its own
// lock, as withWorld does for the process's world group.
func localRunners(t *testing.T, n int, opts comm.Options) []groupRunner {
	groups, err := comm.NewLocal(n, opts)
	require.NoError(t, err)
	out := make([]groupRunner, n)
	for i, g := range groups {
		var mu sync.Mutex
		out[i] = func(fn func(comm.Group) error) error {
			mu.Lock()
			defer mu.Unlock()
			return fn(g)
		}
	}
	t.Cleanup(func() {
		for _, g := range groups {
			g.Close()
		}
	})
	return out
}

func bufs(data ...[]float32) []*bufferObj {
	out := make([]*bufferObj, len(data))
	for i, d := range data {
		out[i] = &bufferObj{data: d}
	}
	return out
}

// TestReducerAveragesInPlaceWhateverTheReadyOrder: two ranks announce
// three buckets in different orders, for two rounds; every bucket ends up
// as the exact average, written into the registered memory itself.
func TestReducerAveragesInPlaceWhateverTheReadyOrder(t *testing.T) {
	runs := localRunners(t, 2, comm.Options{Timeout: 5 * time.Second})
	orders := [][]int{{2, 0, 1}, {0, 1, 2}}
	mem := make([][][]float32, 2)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r := 0; r < 2; r++ {
		mem[r] = [][]float32{rankData(r, 3), rankData(r, 5), rankData(r, 1)}
		red := newReducer(bufs(mem[r]...), runs[r], r, 5*time.Second, false)
		defer red.release()
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			for round := 0; round < 2; round++ {
				for _, i := range orders[r] {
					if err := red.bucketReady(i); err != nil {
						errs[r] = err
						return
					}
				}
				if err := red.waitAll(); err != nil {
					errs[r] = err
					return
				}
			}
		}(r)
	}
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	for i, n := range []int{3, 5, 1} {
		a, b := rankData(0, n), rankData(1, n)
		for k := range a {
			want := (a[k] + b[k]) / 2 // a second round averages equal values: unchanged
			assert.Equal(t, want, mem[0][i][k], "rank 0 bucket %d[%d]", i, k)
			assert.Equal(t, want, mem[1][i][k], "rank 1 bucket %d[%d]", i, k)
		}
	}
}

// TestReducerWaitStartsUnannouncedBuckets: a bucket nobody announced (its
// parameters were unused) is still reduced, by buckets_wait.
func TestReducerWaitStartsUnannouncedBuckets(t *testing.T) {
	runs := localRunners(t, 2, comm.Options{Timeout: 5 * time.Second})
	mem := [][]float32{{2, 4}, {6, 8}}
	more := [][]float32{{1}, {3}}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r := 0; r < 2; r++ {
		red := newReducer(bufs(mem[r], more[r]), runs[r], r, 5*time.Second, false)
		defer red.release()
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			if err := red.bucketReady(1); err != nil {
				errs[r] = err
				return
			}
			errs[r] = red.waitAll()
		}(r)
	}
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	assert.Equal(t, []float32{4, 6}, mem[0])
	assert.Equal(t, []float32{4, 6}, mem[1])
	assert.Equal(t, []float32{2}, more[0])
}

func TestReducerRefusesMisuse(t *testing.T) {
	runs := localRunners(t, 1, comm.Options{})
	red := newReducer(bufs([]float32{1}, []float32{2}), runs[0], 0, time.Second, false)
	require.NoError(t, red.bucketReady(0))
	err := red.bucketReady(0)
	require.Error(t, err)
	assert.Equal(t, "bucket_ready: bucket 0 was already announced in this round; call buckets_wait first", err.Error())
	assert.Equal(t, errState, codeOf(err))
	err = red.bucketReady(2)
	require.Error(t, err)
	assert.Equal(t, "bucket_ready: bucket 2 is outside 0..1", err.Error())
	require.NoError(t, red.waitAll())
	require.NoError(t, red.bucketReady(0), "a new round after buckets_wait")
	red.release()
	err = red.bucketReady(1)
	require.Error(t, err)
	assert.Equal(t, "bucket_ready: rank 0: the reducer was freed", err.Error())
}

// TestReducerTimeoutNamesRankAndBuckets: the peer never announces its
// buckets; the wait gives up at the reducer's timeout, naming this rank and
// the buckets, and the reducer refuses further rounds.
func TestReducerTimeoutNamesRankAndBuckets(t *testing.T) {
	runs := localRunners(t, 2, comm.Options{Timeout: 2 * time.Second})
	red := newReducer(bufs([]float32{1}, []float32{2}), runs[0], 0, 50*time.Millisecond, false)
	defer red.release()
	err := red.waitAll()
	require.Error(t, err)
	assert.Equal(t, errComm, codeOf(err))
	assert.Equal(t, "rank 0: the all-reduce of bucket(s) 0, 1 did not finish within comm.timeout 50ms (is another rank stuck before its backward, or dead?)", err.Error())
	err = red.bucketReady(0)
	require.Error(t, err)
	assert.True(t, strings.HasPrefix(err.Error(), "bucket_ready: rank 0: rank 0: the all-reduce of bucket(s) 0, 1"), err.Error())
}

// TestReducerTraceRecordsEachBucket: one span per bucket and round on the
// comm track, and a ready mark per announced bucket.
func TestReducerTraceRecordsEachBucket(t *testing.T) {
	runs := localRunners(t, 1, comm.Options{})
	red := newReducer(bufs([]float32{1}, []float32{2}, []float32{3}), runs[0], 0, time.Second, true)
	defer red.release()
	require.NoError(t, red.bucketReady(0))
	require.NoError(t, red.waitAll())
	var names []string
	for _, e := range red.rec.Events() {
		names = append(names, e.Name)
	}
	assert.ElementsMatch(t, []string{"bucket 0 ready", "all-reduce bucket 0", "all-reduce bucket 1", "all-reduce bucket 2", "buckets wait"}, names)
}

// TestBufferAndReducerThroughTheABI: registering, a world-of-one reducer
// (the average of one rank is the input), and the errors of bad handles.
func TestBufferAndReducerThroughTheABI(t *testing.T) {
	data := []float32{1, 2, 3}
	_, err := apiBufferRegister(nil)
	assert.Equal(t, "buffer_register: a buffer needs at least one element", fmt.Sprint(err))
	b, err := apiBufferRegister(data)
	require.NoError(t, err)
	_, err = apiReducerNew([]int64{b}, 0, false)
	assert.Equal(t, "reducer_new: timeout 0 s must be positive (comm.timeout)", fmt.Sprint(err))
	h, err := apiReducerNew([]int64{b}, 10, false)
	require.NoError(t, err)
	r, err := get[reducerObj](h)
	require.NoError(t, err)
	require.NoError(t, r.bucketReady(0))
	require.NoError(t, r.waitAll())
	assert.Equal(t, []float32{1, 2, 3}, data)
	require.NoError(t, freeHandle(h))
	require.NoError(t, freeHandle(b))
	_, err = apiReducerNew([]int64{b}, 10, false)
	assert.Equal(t, fmt.Sprintf("handle %d was already freed", b), fmt.Sprint(err))
	_, err = apiReducerNew([]int64{h + 1000}, 10, false)
	assert.Contains(t, fmt.Sprint(err), "is not a tinyacc handle")
}

// Under reducer_reduce_dtype "bf16" a bucket is rounded to bfloat16, averaged
// in float32 and rounded once, in place: 256 on one rank and 259 on the
// other average to 257.5, which rounds to 258 (bf16's last place at 256 is
// 2), and 1/3 + 1/3 averages to bf16's nearest of 1/3 exactly. Other names
// are refused, and so is a change once a round started.
func TestReducerBF16RoundsOnce(t *testing.T) {
	runs := localRunners(t, 2, comm.Options{Timeout: 5 * time.Second})
	mem := [][]float32{{256, 1.0 / 3}, {259, 1.0 / 3}}
	third := float32(0.333984375) // the bfloat16 nearest to 1/3
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r := 0; r < 2; r++ {
		red := newReducer(bufs(mem[r]), runs[r], r, 5*time.Second, false)
		defer red.release()
		require.EqualError(t, red.setReduceDType("fp16"), `reducer_reduce_dtype: "fp16" is not a reduce dtype: use fp32 or bf16 (ddp.reduce_dtype)`)
		require.NoError(t, red.setReduceDType("bf16"))
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			if err := red.bucketReady(0); err != nil {
				errs[r] = err
				return
			}
			if err := red.setReduceDType("fp32"); err == nil || !strings.Contains(err.Error(), "a round has started") {
				errs[r] = fmt.Errorf("changing the dtype mid-round: %v", err)
				return
			}
			errs[r] = red.waitAll()
		}(r)
	}
	wg.Wait()
	for r := 0; r < 2; r++ {
		require.NoError(t, errs[r])
		assert.Equal(t, []float32{258, third}, mem[r], "rank %d", r)
	}
}
