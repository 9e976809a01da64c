package cpu

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// Float is the set of element types the kernels are written for.
type Float interface{ ~float32 | ~float64 }

// threads is the number of goroutines a kernel may use at once.
var threads atomic.Int64

func init() {
	threads.Store(int64(runtime.GOMAXPROCS(0)))
	setBLASThreads(int(threads.Load()))
}

// The BLAS library's own thread count follows Threads(), except while a
// kernel that calls Gemm from several goroutines at once (attention, one
// small product per head; the portable half product, one block of rows
// per goroutine) holds it at one: OpenBLAS serialises concurrent
// multi-threaded calls behind a lock and pays a thread hand-off on each, so
// heads in parallel with single-threaded products measured over ten times
// faster than either heads in parallel with threaded products or heads in
// turn with threaded products (see BenchmarkAttention).
//
// OpenBLAS's results depend on its thread count (it blocks the work
// differently), so the two modes never overlap: a Gemm issued from another
// goroutine (another rank of the local backend) while attention holds the
// library single-threaded waits for it, and attention waits for running
// Gemms. Every product then runs with the same thread count in every run,
// whatever the timing, and runs stay bitwise reproducible.
var (
	blasMu       sync.Mutex
	blasCond     = sync.NewCond(&blasMu)
	blasSerial   int // kernels inside serialBLAS
	blasThreaded int // Gemm calls running with Threads() BLAS threads
)

func setBLASThreads(n int) {
	blasMu.Lock()
	if blasSerial == 0 {
		blasSetThreads(n)
	}
	blasMu.Unlock()
}

// serialBLAS makes BLAS calls single-threaded until the returned function
// is called; nested and concurrent uses are counted. Inside, call gemmBLAS,
// not Gemm.
func serialBLAS() (release func()) {
	blasMu.Lock()
	for blasThreaded > 0 {
		blasCond.Wait()
	}
	if blasSerial == 0 {
		blasSetThreads(1)
	}
	blasSerial++
	blasMu.Unlock()
	return func() {
		blasMu.Lock()
		blasSerial--
		if blasSerial == 0 {
			blasSetThreads(Threads())
			blasCond.Broadcast()
		}
		blasMu.Unlock()
	}
}

// threadedBLAS holds the library at Threads() threads for one Gemm.
func threadedBLAS() (release func()) {
	blasMu.Lock()
	for blasSerial > 0 {
		blasCond.Wait()
	}
	blasThreaded++
	blasMu.Unlock()
	return func() {
		blasMu.Lock()
		blasThreaded--
		if blasThreaded == 0 {
			blasCond.Broadcast()
		}
		blasMu.Unlock()
	}
}

// SetThreads sets how many goroutines kernels may use (values below 1 mean
// 1). It also sets the thread count of the BLAS library when one is linked,
// so that a single-threaded configuration is single-threaded everywhere.
func SetThreads(n int) {
	if n < 1 {
		n = 1
	}
	threads.Store(int64(n))
	setBLASThreads(n)
}

// Threads reports how many goroutines kernels may use.
func Threads() int { return int(threads.Load()) }

// job is one ParallelFor call. Its chunks are claimed through an atomic
// counter by the caller and by any pool worker that picks the job up, so the
// caller never waits for a chunk nobody has started: it runs whatever is left
// itself. That keeps nested calls (a parallel kernel calling another) and
// concurrent callers (several ranks of the local backend in one process) free
// of deadlocks; when the workers are busy they simply get less parallelism.
type job struct {
	fn     func(lo, hi int)
	n      int
	chunks int
	next   atomic.Int64
	wg     sync.WaitGroup
}

// run claims and executes chunks until none are left.
func (j *job) run() {
	for {
		i := int(j.next.Add(1)) - 1
		if i >= j.chunks {
			return
		}
		// Chunk i covers [i*n/chunks, (i+1)*n/chunks): sizes differ by at most one.
		j.fn(i*j.n/j.chunks, (i+1)*j.n/j.chunks)
		j.wg.Done()
	}
}

// The pool's workers are started lazily and live for the whole process: a
// training step issues thousands of kernel calls, and waking a parked worker
// is cheaper than creating a goroutine for each chunk of each call.
var (
	poolMu      sync.Mutex
	poolWorkers int
	poolJobs    = make(chan *job, 256)
)

// ensureWorkers starts workers until n are running.
func ensureWorkers(n int) {
	poolMu.Lock()
	for poolWorkers < n {
		poolWorkers++
		go func() {
			for j := range poolJobs {
				j.run()
			}
		}()
	}
	poolMu.Unlock()
}

// ParallelFor calls fn on contiguous chunks that together cover [0, n),
// using up to Threads() goroutines, and returns when all chunks are done.
// Chunks hold at least grain indices, so small loops run inline on the
// caller without any synchronisation.
//
// The split depends on Threads(), so fn must compute each index's result
// independently of where the chunk boundaries fall; reductions across
// indices must go through fixed blocks (see LayerNormBackward).
func ParallelFor(n, grain int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	if grain < 1 {
		grain = 1
	}
	chunks := Threads()
	if most := (n + grain - 1) / grain; most < chunks {
		chunks = most
	}
	if chunks <= 1 {
		fn(0, n)
		return
	}
	ensureWorkers(chunks - 1)
	j := &job{fn: fn, n: n, chunks: chunks}
	j.wg.Add(chunks)
	for i := 1; i < chunks; i++ {
		select {
		case poolJobs <- j:
		default: // queue full: the caller and the busy workers share the chunks
		}
	}
	j.run()
	j.wg.Wait()
}
