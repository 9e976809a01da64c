// Package commbench measures the collectives of a comm.Group the way
// NVIDIA's nccl-tests do (median time, algorithm and bus bandwidth), so the
// numbers compare with published ones.
package commbench

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// Ops lists the operations Run measures. memcpy is no collective: every
// rank copies a buffer of the size into another at once, the bandwidth of
// the memory that a collective on one host moves its data through.
var Ops = []string{"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "memcpy"}

// BusFactor converts algorithm bandwidth to bus bandwidth for op on n ranks:
// the fraction of the buffer each link carries, so a bus bandwidth near the
// link speed means the algorithm is optimal whatever n is.
func BusFactor(op string, n int) (float64, error) {
	switch op {
	case "all_reduce":
		return 2 * float64(n-1) / float64(n), nil
	case "all_gather", "reduce_scatter", "all_to_all":
		return float64(n-1) / float64(n), nil
	case "broadcast", "memcpy":
		return 1, nil
	}
	return 0, fmt.Errorf("commbench: unknown op %q (use one of %s)", op, strings.Join(Ops, ", "))
}

// Result is one measured size; the JSON keys are part of the CLI's output.
type Result struct {
	Op        string  `json:"op"`
	NRanks    int     `json:"nranks"`
	Bytes     int64   `json:"bytes"`
	TimeMs    float64 `json:"time_ms"`
	AlgBWGBps float64 `json:"algbw_gbps"`
	BusBWGBps float64 `json:"busbw_gbps"`
}

// Run measures op at every size (bytes of float32 data; for all_gather and
// reduce_scatter the size is the full buffer, count×4×N; for all_to_all
// what each rank sends, N blocks of count×4, equal to what it receives)
// with warmup
// untimed iterations and iters timed ones, each between barriers, and takes
// the median. Rank 0 writes a table, or one JSON object per size, to w.
// Every rank of g must call Run with the same arguments.
func Run(g comm.Group, op string, sizes []int64, iters, warmup int, w io.Writer, asJSON bool) error {
	n := g.Size()
	factor, err := BusFactor(op, n)
	if err != nil {
		return err
	}
	if iters < 1 {
		return fmt.Errorf("commbench: iters %d must be at least 1", iters)
	}
	if g.Rank() == 0 && !asJSON {
		fmt.Fprintf(w, "# %s on %d ranks\n%12s %12s %14s %14s\n", op, n, "size", "time_ms", "algbw GB/s", "busbw GB/s")
	}
	for _, size := range sizes {
		count := int(size / 4)
		if op == "all_gather" || op == "reduce_scatter" || op == "all_to_all" {
			count = int(size / 4 / int64(n))
		}
		if count < 1 {
			return fmt.Errorf("commbench: size %d bytes is too small for %s on %d ranks", size, op, n)
		}
		bytes := int64(count) * 4
		if op == "all_gather" || op == "reduce_scatter" || op == "all_to_all" {
			bytes *= int64(n)
		}
		step, err := prepare(g, op, count)
		if err != nil {
			return err
		}
		times := make([]time.Duration, 0, iters)
		for i := 0; i < warmup+iters; i++ {
			if err := g.Barrier(); err != nil {
				return err
			}
			start := time.Now()
			if err := step(); err != nil {
				return err
			}
			if err := g.Barrier(); err != nil {
				return err
			}
			if i >= warmup {
				times = append(times, time.Since(start))
			}
		}
		sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
		med := times[len(times)/2]
		sec := med.Seconds()
		r := Result{Op: op, NRanks: n, Bytes: bytes, TimeMs: sec * 1e3}
		if sec > 0 {
			r.AlgBWGBps = float64(bytes) / sec / 1e9
			r.BusBWGBps = r.AlgBWGBps * factor
		}
		if g.Rank() != 0 {
			continue
		}
		if asJSON {
			b, _ := json.Marshal(r)
			fmt.Fprintf(w, "%s\n", b)
		} else {
			fmt.Fprintf(w, "%12s %12.3f %14.3f %14.3f\n", FormatSize(bytes), r.TimeMs, r.AlgBWGBps, r.BusBWGBps)
		}
	}
	return nil
}

func prepare(g comm.Group, op string, count int) (func() error, error) {
	n := g.Size()
	a := tensor.Default.New(tensor.Comm, tensor.Float32, count)
	for i := range a.F32() {
		a.F32()[i] = float32(i % 13)
	}
	switch op {
	case "all_reduce":
		return func() error { return g.AllReduce(a, comm.Sum) }, nil
	case "broadcast":
		return func() error { return g.Broadcast(a, 0) }, nil
	case "memcpy":
		dst := tensor.Default.New(tensor.Comm, tensor.Float32, count)
		return func() error { copy(dst.F32(), a.F32()); return nil }, nil
	case "all_gather":
		out := tensor.Default.New(tensor.Comm, tensor.Float32, count*n)
		return func() error { return g.AllGather(a, out) }, nil
	case "reduce_scatter":
		in := tensor.Default.New(tensor.Comm, tensor.Float32, count*n)
		return func() error { return g.ReduceScatter(in, a, comm.Sum) }, nil
	case "all_to_all":
		in := tensor.Default.New(tensor.Comm, tensor.Float32, count*n)
		out := tensor.Default.New(tensor.Comm, tensor.Float32, count*n)
		return func() error { return g.AllToAll(in, out) }, nil
	}
	_, err := BusFactor(op, n)
	return nil, err
}

// ParseSizes parses a comma-separated list such as "4K,64K,1M,16M,64M"
// (K = KiB, M = MiB, G = GiB; a bare number is bytes).
func ParseSizes(s string) ([]int64, error) {
	var out []int64
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		mult := int64(1)
		switch strings.ToUpper(f[len(f)-1:]) {
		case "K":
			mult = 1 << 10
		case "M":
			mult = 1 << 20
		case "G":
			mult = 1 << 30
		}
		num := f
		if mult != 1 {
			num = f[:len(f)-1]
		}
		v, err := strconv.ParseInt(num, 10, 64)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("commbench: size %q is not a positive number with an optional K, M or G suffix", f)
		}
		out = append(out, v*mult)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("commbench: no sizes in %q", s)
	}
	return out, nil
}

// FormatSize writes bytes with the largest exact binary suffix.
func FormatSize(b int64) string {
	switch {
	case b >= 1<<30 && b%(1<<30) == 0:
		return fmt.Sprintf("%dG", b>>30)
	case b >= 1<<20 && b%(1<<20) == 0:
		return fmt.Sprintf("%dM", b>>20)
	case b >= 1<<10 && b%(1<<10) == 0:
		return fmt.Sprintf("%dK", b>>10)
	}
	return strconv.FormatInt(b, 10)
}
