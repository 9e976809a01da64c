package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/comm/commbench"
	"github.com/tinyacc/tinyacc/core/launch"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/plan"
)

// calibOps are the collectives the cost model reads; broadcast over two
// ranks stands for a point-to-point message.
var calibOps = []string{"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"}

// calibSizes are the buffer sizes a collective is timed at: the
// latency at the smallest, the bus bandwidth as the slope between the
// other two, far enough apart (several milliseconds on tcp) that a
// scheduler's hiccup of a few hundred microseconds moves it little.
var calibSizes = []int64{4 << 10, 1 << 20, 8 << 20}

// calibRounds is how many times each collective is timed at calibSizes
// (commbench's median of calibIters each), interleaved with the other
// collectives; the median of the rounds is kept.
const calibRounds, calibIters = 3, 15

// planCalibrate measures this machine for the cost model (plan.Profile)
// in well under a minute: matrix products of five size classes, an
// element-wise kernel and the optimizer's update, each with one thread
// and with every core's; a reference model's step at two batch sizes in
// one thread, whose fixed part (less the update) is the per-block
// overhead; the same step in 1, 2 … --nproc processes at once against
// what the rates predict (the efficiency, median of effRounds); each
// collective of calibOps at calibSizes on groups of 2 up to --nproc
// ranks as processes over tcp (commbench, median of calibRounds), what a
// small one adds between compute (measureBusy, median of three) and what
// one of two of the ranks adds while the others compute
// (measureContended, median of three); and the overlap: how
// much of an all-reduce runs hidden while the same ranks multiply
// matrices. It writes the profile to --profile (default
// plan.DefaultPath).
func planCalibrate(args []string, stdout, stderr io.Writer) error {
	f := planFlags{nproc: 4}
	var commOut string
	for i := 0; i < len(args); i++ {
		name, val, eq := strings.Cut(args[i], "=")
		if !eq && i+1 < len(args) {
			i++
			val = args[i]
		}
		switch name {
		case "--profile":
			f.profile = val
		case "--nproc":
			n, err := strconv.Atoi(val)
			if err != nil || n < 2 {
				return fmt.Errorf("plan calibrate: --nproc %q: want a whole number >= 2, the most ranks to measure collectives on", val)
			}
			f.nproc = n
		case "--comm-out": // a launched rank of the collectives' job
			commOut = val
		case "--ref-out": // a launched process of the reference steps
			return referenceRank(val)
		default:
			return fmt.Errorf("plan calibrate: unknown flag %q (use --profile FILE, --nproc N)", name)
		}
	}
	if commOut != "" {
		return calibrateRank(commOut)
	}
	path := f.profile
	if path == "" {
		p, err := plan.DefaultPath()
		if err != nil {
			return err
		}
		path = p
	}
	start := time.Now()
	prof := &plan.Profile{Host: plan.ThisHost(), Made: time.Now().UTC()}
	cores := runtime.NumCPU()
	for _, d := range []int{16, 64, 128, 256, 512} {
		one := withThreads(1, func() float64 { return gemmRate(d) })
		all := withThreads(cores, func() float64 { return gemmRate(d) })
		prof.MatMul = append(prof.MatMul, plan.MatMulRate{Class: float64(d), FLOPS: plan.Pair{One: one, All: all}})
		fmt.Fprintf(stdout, "matmul %4d³: %6.2f GFLOP/s one thread, %6.2f all %d\n", d, one/1e9, all/1e9, cores)
	}
	prof.Elementwise = plan.Pair{One: withThreads(1, geluRate), All: withThreads(cores, geluRate)}
	fmt.Fprintf(stdout, "element-wise (GELU): %.2f GB/s one thread, %.2f all\n", prof.Elementwise.One/1e9, prof.Elementwise.All/1e9)
	prof.Optimizer = plan.Pair{One: withThreads(1, adamWRate), All: withThreads(cores, adamWRate)}
	fmt.Fprintf(stdout, "optimizer (AdamW): %.2f GB/s one thread, %.2f all\n", prof.Optimizer.One/1e9, prof.Optimizer.All/1e9)

	if err := blockOverhead(prof); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "fixed cost of a block's forward and backward on a micro-batch: %.0f µs\n", 1e6*prof.BlockOverhead)

	exe, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "tinyacc-calibrate")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for n := 1; n <= f.nproc; n++ {
		if n > 2 && n != f.nproc && n&(n-1) != 0 {
			continue // 1, 2, the powers of two and --nproc
		}
		// The median of effRounds runs: one run's share moved from 0.53
		// to 0.79 between calibrations, and every prediction scales by it.
		var shares []float64
		for range effRounds {
			e, err := referenceEfficiency(exe, dir, n, prof, stderr)
			if err != nil {
				return err
			}
			shares = append(shares, e.Share)
		}
		eff := plan.Efficiency{Ranks: n, Share: median(shares)}
		prof.Efficiency = append(prof.Efficiency, eff)
		fmt.Fprintf(stdout, "reference step (GPT 2×128, context 128, batch 4) in %d process(es) at once: %.2f of the rates\n", n, eff.Share)
		if n == 1 {
			continue
		}
		out := filepath.Join(dir, fmt.Sprintf("comm%d.json", n))
		lo := launch.Options{NProc: n, Stdout: io.Discard, Stderr: stderr}
		if err := launch.Run(context.Background(), lo, []string{exe, "plan", "calibrate", "--comm-out", out}); err != nil {
			return fmt.Errorf("plan calibrate: collectives on %d ranks: %w", n, err)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			return err
		}
		var m calibComm
		if err := json.Unmarshal(b, &m); err != nil {
			return fmt.Errorf("plan calibrate: %s: %w", out, err)
		}
		for _, c := range m.Costs {
			contended := ""
			if n > 2 {
				contended = fmt.Sprintf(", %7.1f µs for 2 of them while the others compute", 1e6*c.Contended)
			}
			fmt.Fprintf(stdout, "%-14s on %d ranks (tcp): latency %7.1f µs (%7.1f µs between compute%s), bus bandwidth %6.2f GB/s\n", c.Op, c.N, 1e6*c.Latency, 1e6*c.Busy, contended, c.BusBW/1e9)
		}
		prof.Collectives = append(prof.Collectives, m.Costs...)
		if n == 2 {
			prof.Overlap = m.Overlap
			fmt.Fprintf(stdout, "overlap of an all-reduce with matrix products on 2 ranks: %.2f\n", m.Overlap)
		}
	}
	if err := prof.Save(path); err != nil {
		return fmt.Errorf("plan calibrate: %w", err)
	}
	fmt.Fprintf(stdout, "tinyacc: wrote the profile of %s (%d cores) to %s in %.1f s\n", prof.Host.Name, prof.Host.Cores, path, time.Since(start).Seconds())
	if why := prof.Busy(); len(why) > 0 {
		fmt.Fprintf(stderr, "tinyacc: plan calibrate: the machine was busy while measuring (%s): plan's predictions from this profile describe that moment; calibrate again when it is quiet\n", strings.Join(why, "; "))
	}
	return nil
}

// withThreads runs f with n compute threads.
func withThreads(n int, f func() float64) float64 {
	prevProcs, prev := runtime.GOMAXPROCS(n), cpu.Threads()
	cpu.SetThreads(n)
	defer func() { runtime.GOMAXPROCS(prevProcs); cpu.SetThreads(prev) }()
	return f()
}

// timeFor is the seconds per call of f: the fastest of five rounds of at
// least d each (and 3 calls), so that a busy machine's slow moments are
// left out.
func timeFor(d time.Duration, f func()) float64 {
	f() // warm
	best := math.Inf(1)
	for range 5 {
		n := 0
		start := time.Now()
		for n < 3 || time.Since(start) < d {
			f()
			n++
		}
		best = min(best, time.Since(start).Seconds()/float64(n))
	}
	return best
}

// gemmRate is the FLOP/s of d×d by d×d float32 products.
func gemmRate(d int) float64 {
	a, b, c := make([]float32, d*d), make([]float32, d*d), make([]float32, d*d)
	for i := range a {
		a[i], b[i] = float32(i%7)*0.1, float32(i%5)*0.1
	}
	s := timeFor(20*time.Millisecond, func() { cpu.Gemm(false, false, d, d, d, 1, a, d, b, d, 0, c, d) })
	return 2 * float64(d*d*d) / s
}

// geluRate is the bytes per second GELU's forward reads and writes.
func geluRate() float64 {
	const n = 1 << 21
	x, y := make([]float32, n), make([]float32, n)
	for i := range x {
		x[i] = float32(i%17) * 0.1
	}
	s := timeFor(20*time.Millisecond, func() { cpu.GeluForward(x, y) })
	return 8 * n / s
}

// adamWRate is the bytes per second the trainer's float32 AdamW update
// moves, 32 a parameter (the cost model's count), on as many parameters
// as the reference model has, so that the update blockOverhead takes out
// of the reference step is the one it ran.
func adamWRate() float64 {
	n := int(trainerParams(refShape))
	p, g, m, v := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range p {
		p[i], g[i] = float32(i%7)*0.1, float32(i%5)*0.01
	}
	t := 0
	s := timeFor(20*time.Millisecond, func() { t++; cpu.AdamW(p, g, m, v, 1e-3, 0.9, 0.999, 1e-8, 0.1, t) })
	return 32 * float64(n) / s
}

// calibComm is what one collectives' job reports.
type calibComm struct {
	Costs   []plan.CollectiveCost `json:"costs"`
	Overlap float64               `json:"overlap"`
}

// calibrateRank is one rank of the collectives' job: each op of calibOps
// at calibSizes (commbench), a latency and bus bandwidth fitted through
// the two, then the overlap; rank 0 writes them to out.
func calibrateRank(out string) error {
	g, err := comm.InitFromEnv(comm.Options{Backend: "tcp"})
	if err != nil {
		return err
	}
	n := g.Size()
	var res calibComm
	times := make(map[string][][]float64) // op → size → the rounds' medians (s)
	for range calibRounds {
		for _, op := range calibOps {
			var buf bytes.Buffer
			if err := commbench.Run(g, op, calibSizes, calibIters, 3, &buf, true); err != nil {
				return err
			}
			if g.Rank() != 0 {
				continue
			}
			var rs []commbench.Result
			dec := json.NewDecoder(&buf)
			for dec.More() {
				var r commbench.Result
				if err := dec.Decode(&r); err != nil {
					return err
				}
				rs = append(rs, r)
			}
			if len(rs) != len(calibSizes) {
				return fmt.Errorf("plan calibrate: %s: %d results, want %d", op, len(rs), len(calibSizes))
			}
			if times[op] == nil {
				times[op] = make([][]float64, len(rs))
			}
			for i, r := range rs {
				times[op][i] = append(times[op][i], r.TimeMs/1e3)
			}
		}
	}
	if g.Rank() == 0 {
		for _, op := range calibOps {
			f, _ := commbench.BusFactor(op, n)
			var t [3]float64
			for i := range t {
				t[i] = median(times[op][i])
			}
			lat, bw := fitCollective(f, t)
			res.Costs = append(res.Costs, plan.CollectiveCost{Backend: "tcp", Op: op, N: n, Latency: lat, BusBW: bw})
		}
	}
	var busy []float64
	for range 3 {
		b, err := measureBusy(g)
		if err != nil {
			return err
		}
		busy = append(busy, b)
	}
	var contended []float64
	for range 3 {
		c, err := measureContended(g)
		if err != nil {
			return err
		}
		contended = append(contended, c)
	}
	for i := range res.Costs {
		res.Costs[i].Busy = median(busy)
		res.Costs[i].Contended = median(contended)
	}
	if n == 2 {
		var ovs []float64
		for range 3 {
			ov, err := measureOverlap(g)
			if err != nil {
				return err
			}
			ovs = append(ovs, ov)
		}
		res.Overlap = median(ovs)
	}
	if g.Rank() == 0 {
		b, err := json.Marshal(res)
		if err != nil {
			return err
		}
		if err := os.WriteFile(out, b, 0o644); err != nil {
			return err
		}
	}
	return g.Close()
}

// fitCollective is the latency and bus bandwidth of a collective whose
// bus factor is f, from its times t at calibSizes: the bandwidth is the
// slope between the two larger sizes (the whole time of the largest
// where it did not grow), the latency what the smallest took beyond its
// bytes at that bandwidth.
func fitCollective(f float64, t [3]float64) (lat, bw float64) {
	b1, b2 := f*float64(calibSizes[1]), f*float64(calibSizes[2])
	bw = b2 / t[2]
	if t[2] > t[1] {
		bw = (b2 - b1) / (t[2] - t[1])
	}
	return max(0, t[0]-f*float64(calibSizes[0])/bw), bw
}

// measureBusy is what a small collective adds between compute on every
// rank: 100 rounds of matrix products alone, then 100 rounds of the same
// products each followed by a 4 KiB all-reduce; the difference per round.
// The rounds span many of the scheduler's time slices, so a rank that
// loses its core while it waits is in the figure.
func measureBusy(g comm.Group) (float64, error) {
	var t [2]float64
	for i, sync := range []bool{false, true} {
		if err := g.Barrier(); err != nil {
			return 0, err
		}
		var err error
		if t[i], err = busyRounds(g, sync); err != nil {
			return 0, err
		}
	}
	return max(0, t[1]-t[0]) / busyRoundCount, nil
}

// busyRoundCount is how many rounds busyRounds runs.
const busyRoundCount = 100

// busyRounds times busyRoundCount rounds of 8 products of 128³, each
// round followed by a 4 KiB all-reduce over g when sync is set.
func busyRounds(g comm.Group, sync bool) (float64, error) {
	const d = 128
	a, b, c := make([]float32, d*d), make([]float32, d*d), make([]float32, d*d)
	t := tensor.Default.New(tensor.Comm, tensor.Float32, 1024)
	defer t.Release()
	start := time.Now()
	for range busyRoundCount {
		for range 8 {
			cpu.Gemm(false, false, d, d, d, 1, a, d, b, d, 0, c, d)
		}
		if sync {
			if err := g.AllReduce(t, comm.Sum); err != nil {
				return 0, err
			}
		}
	}
	return time.Since(start).Seconds(), nil
}

// measureContended is measureBusy for a group of two inside the world
// while the world's other ranks compute without waiting for it, as
// another pipeline stage does: ranks 0 and 1 run the rounds alone and
// then with an all-reduce over the two, while the others multiply
// matrices until rank 0 tells them the pair is done. A member that
// waits gives its core to those ranks and gets one back only when the
// scheduler takes it from one of them, which ranks that wait for each
// other in step (measureBusy) do not see. 0 with fewer than 3 ranks.
func measureContended(g comm.Group) (float64, error) {
	n := g.Size()
	if n < 3 {
		return 0, nil
	}
	pair, err := g.NewGroup([]int{0, 1})
	if err != nil {
		return 0, err
	}
	var t [2]float64
	for i, sync := range []bool{false, true} {
		if err := g.Barrier(); err != nil {
			return 0, err
		}
		flag := tensor.Default.New(tensor.Comm, tensor.Float32, 1)
		switch g.Rank() {
		case 0, 1:
			if t[i], err = busyRounds(pair, sync); err != nil {
				return 0, err
			}
			if g.Rank() == 0 {
				for r := 2; r < n; r++ {
					if err := g.Send(flag, r); err != nil {
						return 0, err
					}
				}
			}
		default:
			const d = 128
			a, b, c := make([]float32, d*d), make([]float32, d*d), make([]float32, d*d)
			var done atomic.Bool
			var werr error
			h := g.RecvAsync(flag, 0)
			go func() { werr = h.Wait(); done.Store(true) }()
			for !done.Load() {
				cpu.Gemm(false, false, d, d, d, 1, a, d, b, d, 0, c, d)
			}
			if werr != nil {
				return 0, werr
			}
		}
		flag.Release()
	}
	if pair != nil {
		if err := pair.Close(); err != nil {
			return 0, err
		}
	}
	return max(0, t[1]-t[0]) / busyRoundCount, nil
}

// measureOverlap times, on every rank, matrix products alone, all-reduces
// of 1 MiB alone, and both at once (the all-reduces on their own
// goroutine, as DDP's buckets run beside backward): the overlap is the
// time saved over the sum, as a share of the shorter, between 0 and 1.
func measureOverlap(g comm.Group) (float64, error) {
	const d = 192
	a, b, c := make([]float32, d*d), make([]float32, d*d), make([]float32, d*d)
	t := tensor.Default.New(tensor.Comm, tensor.Float32, 1<<18)
	compute := func() {
		for range 40 {
			cpu.Gemm(false, false, d, d, d, 1, a, d, b, d, 0, c, d)
		}
	}
	reduce := func() error {
		for range 20 {
			if err := g.AllReduce(t, comm.Sum); err != nil {
				return err
			}
		}
		return nil
	}
	timed := func(f func() error) (float64, error) {
		if err := g.Barrier(); err != nil {
			return 0, err
		}
		start := time.Now()
		err := f()
		return time.Since(start).Seconds(), err
	}
	tc, err := timed(func() error { compute(); return nil })
	if err != nil {
		return 0, err
	}
	ta, err := timed(reduce)
	if err != nil {
		return 0, err
	}
	tb, err := timed(func() error {
		done := make(chan error, 1)
		go func() { done <- reduce() }()
		compute()
		return <-done
	})
	if err != nil {
		return 0, err
	}
	return min(1, max(0, (tc+ta-tb)/min(tc, ta))), nil
}

// blockOverhead measures the reference step with 1 and with 8 sequences
// in one thread (the fastest of five interleaved rounds each, so that a
// busy machine's slow moments are left out) and extrapolates to none:
// what is left, less the optimizer's update at its measured rate (the
// update the step runs, not an element-wise kernel's: the two run
// different loops), is fixed cost, shared out per block (and the head,
// as one more).
func blockOverhead(prof *plan.Profile) error {
	ms := [2]float64{math.Inf(1), math.Inf(1)}
	for range 5 {
		for i, b := range []int{1, 8} {
			s := refShape
			s.Batch = b
			t, err := tinyaccStepMS(s, "no", 1, 1, 6)
			if err != nil {
				return fmt.Errorf("plan calibrate: the reference step: %w", err)
			}
			ms[i] = min(ms[i], t)
		}
	}
	fixed := (ms[0] - (ms[1]-ms[0])/7) / 1e3
	optim := 32 * float64(trainerParams(refShape)) / prof.Optimizer.One
	prof.BlockOverhead = max(0, fixed-optim) / float64(refShape.NLayer+1)
	return nil
}

// trainerParams is the reference model's parameter count.
func trainerParams(s benchShape) int64 {
	return trainer.GPTConfig(s.config()).ActiveParams()
}

// effRounds is how many times referenceEfficiency runs per rank count.
const effRounds = 3

// refShape is the reference model whose step the efficiency compares
// with the rates.
var refShape = benchShape{NLayer: 2, NHead: 4, NEmbd: 128, Block: 128, Vocab: 256, Batch: 4}

// referenceEfficiency runs the reference step in n processes at once
// (each alone, every core's threads, as train.threads=0 does) and returns
// what the rates of prof predict for one of n ranks over the median of
// the processes' measured step.
func referenceEfficiency(exe, dir string, n int, prof *plan.Profile, stderr io.Writer) (plan.Efficiency, error) {
	out := filepath.Join(dir, fmt.Sprintf("ref%d", n))
	if err := os.MkdirAll(out, 0o755); err != nil {
		return plan.Efficiency{}, err
	}
	lo := launch.Options{NProc: n, Stdout: io.Discard, Stderr: stderr}
	if err := launch.Run(context.Background(), lo, []string{exe, "plan", "calibrate", "--ref-out", out}); err != nil {
		return plan.Efficiency{}, fmt.Errorf("plan calibrate: the reference step in %d processes: %w", n, err)
	}
	var ms []float64
	for r := range n {
		b, err := os.ReadFile(filepath.Join(out, strconv.Itoa(r)))
		if err != nil {
			return plan.Efficiency{}, err
		}
		x, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
		if err != nil {
			return plan.Efficiency{}, err
		}
		ms = append(ms, x)
	}
	cfg := refShape.config()
	cfg.Train.BatchSize = refShape.Batch
	rates := *prof
	rates.Efficiency = nil
	pred, err := plan.Predict(cfg, n, &rates)
	if err != nil {
		return plan.Efficiency{}, err
	}
	// Predict on n ranks counts the layout's collectives too; the
	// reference processes run none, so only compute is compared.
	return plan.Efficiency{Ranks: n, Share: pred.Compute / (median(ms) / 1e3)}, nil
}

// referenceRank is one process of referenceEfficiency: it trains the
// reference model alone and writes its median step (ms) to dir/RANK.
func referenceRank(dir string) error {
	g, err := comm.InitFromEnv(comm.Options{Backend: "tcp"})
	if err != nil {
		return err
	}
	if err := g.Barrier(); err != nil { // start together
		return err
	}
	ms, err := tinyaccStepMS(refShape, "no", runtime.NumCPU(), 2, 16)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(g.Rank())), []byte(strconv.FormatFloat(ms, 'f', -1, 64)), 0o644); err != nil {
		return err
	}
	if err := g.Barrier(); err != nil { // nobody ends early and frees the cores
		return err
	}
	return g.Close()
}
