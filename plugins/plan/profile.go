package plan

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"
)

// Profile is what the cost model knows of a machine, measured by `tinyacc
// plan calibrate`: the rates of its kernels and the costs of its
// collectives. Predict is a pure function of it (and of the layout).
type Profile struct {
	Host Host      `json:"host"`
	Made time.Time `json:"made"`
	// MatMul is the rate of float32 matrix products by shape class, one
	// thread and every thread, sorted by class.
	MatMul []MatMulRate `json:"matmul"`
	// Elementwise is the bytes per second a kernel that reads and writes
	// every float once moves (GELU), one thread and every thread.
	Elementwise Pair `json:"elementwise_bytes_per_s"`
	// Optimizer is the bytes per second AdamW's update moves (32 a
	// parameter: it reads the parameter, its gradient and both moments
	// and writes three of them back), timed on the update the trainer
	// runs, one thread and every thread. It runs as its own vectorised
	// loop, faster than GELU's; zero in a profile made before calibrate
	// measured it, which then prices the update at Elementwise.
	Optimizer   Pair             `json:"optimizer_bytes_per_s,omitempty"`
	Collectives []CollectiveCost `json:"collectives"`
	// BlockOverhead is the seconds one block's forward and backward on one
	// micro-batch cost beyond its FLOPs and bytes (the autograd's nodes,
	// the allocator, each kernel's set-up), on one core: the fixed part
	// of a reference step measured at two batch sizes, per block.
	BlockOverhead float64 `json:"block_overhead_s"`
	// Efficiency is, per number of ranks sharing the machine, the share of
	// the kernel rates a real training step achieves: the predicted time
	// of one step of a reference model when that many processes (each
	// with every core's threads, as train.threads=0 runs) train it at
	// once, over its measured time. The autograd, the allocator, the
	// products' real shapes and the ranks' threads competing for the
	// cores are in the second, not the first. Compute times are divided
	// by the entry of the nearest rank count; none reads as 1.
	Efficiency []Efficiency `json:"efficiency"`
	// Overlap is the share of a collective that runs hidden behind
	// compute on the ranks' cores: 1 when compute and communication
	// together take as long as the longer alone, 0 when they take the sum.
	Overlap float64 `json:"overlap"`
}

// optimizerRate is the optimizer's bytes per second with share cores:
// Optimizer where measured, else Elementwise.
func (p *Profile) optimizerRate(share float64) float64 {
	if p.Optimizer.One > 0 && p.Optimizer.All > 0 {
		return scaled(p.Optimizer.One, p.Optimizer.All, share)
	}
	return scaled(p.Elementwise.One, p.Elementwise.All, share)
}

// Efficiency is what Ranks processes training at once achieve of the
// kernel rates (see Profile.Efficiency).
type Efficiency struct {
	Ranks int     `json:"ranks"`
	Share float64 `json:"share"`
}

// efficiency is the entry of the rank count nearest world, 1 when none.
func (p *Profile) efficiency(world int) float64 {
	best, e := -1, 1.0
	for _, x := range p.Efficiency {
		if x.Share > 0 && (best < 0 || abs(x.Ranks-world) < abs(best-world)) {
			best, e = x.Ranks, x.Share
		}
	}
	return e
}

// Host names a machine, so that a profile read on another one is said to be.
type Host struct {
	Name  string `json:"name"`
	CPU   string `json:"cpu"`
	Cores int    `json:"cores"`
	Arch  string `json:"arch"`
}

// ThisHost is the machine this process runs on.
func ThisHost() Host {
	name, _ := os.Hostname()
	return Host{Name: name, CPU: cpuModel(), Cores: runtime.NumCPU(), Arch: runtime.GOARCH}
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// Pair is a rate with one thread and with every core's thread.
type Pair struct {
	One float64 `json:"one_thread"`
	All float64 `json:"all_threads"`
}

// MatMulRate is the FLOP/s of products whose size class is Class: the
// cube root of m·n·k, so a thin product ranks with a small square one.
type MatMulRate struct {
	Class float64 `json:"class"`
	FLOPS Pair    `json:"flops"`
}

// CollectiveCost is one collective on a group of N ranks of a backend:
// time(bytes) = max(Latency, Busy) + bytes·BusFactor/BusBW, with bytes
// the buffer as commbench counts it. Latency is measured between idle
// ranks; Busy is what a small one adds between the ranks' compute, as in
// a step: on a machine with fewer cores than ranks, a rank that waits is
// woken only when the scheduler gives it a core back. Contended is what
// a small one of two ranks adds while the other N-2 compute without
// waiting for them (another pipeline stage): the ranks that compute hold
// the cores until the scheduler preempts them (0 when not measured: N <
// 3, or a profile made before calibrate measured it).
type CollectiveCost struct {
	Backend   string  `json:"backend"`
	Op        string  `json:"op"`
	N         int     `json:"n"`
	Latency   float64 `json:"latency_s"`
	Busy      float64 `json:"busy_latency_s"`
	Contended float64 `json:"contended_latency_s,omitempty"`
	BusBW     float64 `json:"busbw_bytes_per_s"`
}

// DefaultPath is where calibrate writes and plan reads a profile unless
// told otherwise: tinyacc/plan-profile.json in the user's cache directory.
func DefaultPath() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("plan: no user cache directory (%v): give --profile FILE", err)
	}
	return filepath.Join(dir, "tinyacc", "plan-profile.json"), nil
}

// ErrNoProfile is Load's error for a file that does not exist.
var ErrNoProfile = errors.New("no profile")

// Load reads a profile file.
func Load(path string) (*Profile, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w at %s", ErrNoProfile, path)
	}
	if err != nil {
		return nil, err
	}
	var p Profile
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("plan: profile %s: %w", path, err)
	}
	if err := p.check(); err != nil {
		return nil, fmt.Errorf("plan: profile %s: %w", path, err)
	}
	return &p, nil
}

// Save writes p to path, making its directory.
func (p *Profile) Save(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func (p *Profile) check() error {
	if len(p.MatMul) == 0 || !(p.Elementwise.One > 0) || !(p.Elementwise.All > 0) || p.Host.Cores < 1 {
		return errors.New("it lacks matrix-product or kernel rates or the host's cores: run tinyacc plan calibrate again")
	}
	for _, m := range p.MatMul {
		if !(m.Class > 0 && m.FLOPS.One > 0 && m.FLOPS.All > 0) {
			return fmt.Errorf("matrix-product class %g has no positive rate: run tinyacc plan calibrate again", m.Class)
		}
	}
	sort.Slice(p.MatMul, func(i, j int) bool { return p.MatMul[i].Class < p.MatMul[j].Class })
	return nil
}

// Busy lists what in p could not have been measured on an idle machine,
// or nil: an efficiency above 1 (a reference step faster than its
// kernels' measured rates allow), every core's threads slower than one
// thread on the largest products (the other threads did not get their
// cores), a block with no fixed cost (the step of 8 sequences measured
// slower than 8 of 1 allow). Other programs' load during calibrate does
// this; the profile then describes that moment, not the machine.
func (p *Profile) Busy() []string {
	var why []string
	for _, e := range p.Efficiency {
		if e.Share > 1 {
			why = append(why, fmt.Sprintf("%d ranks at once ran at %.2f of the kernel rates (above 1)", e.Ranks, e.Share))
		}
	}
	if n := len(p.MatMul); n > 0 && p.Host.Cores > 1 {
		if m := p.MatMul[n-1]; m.FLOPS.All < m.FLOPS.One {
			why = append(why, fmt.Sprintf("%g³ products ran slower on %d threads than on one (%.1f against %.1f GFLOP/s)", m.Class, p.Host.Cores, m.FLOPS.All/1e9, m.FLOPS.One/1e9))
		}
	}
	if p.BlockOverhead == 0 {
		why = append(why, "a block's fixed cost came out 0")
	}
	return why
}

// Elsewhere says how host differs from the one p was made on, or "".
func (p *Profile) Elsewhere(h Host) string {
	var d []string
	if p.Host.Name != h.Name {
		d = append(d, fmt.Sprintf("host %q, not %q", p.Host.Name, h.Name))
	}
	if p.Host.CPU != h.CPU {
		d = append(d, fmt.Sprintf("CPU %q, not %q", p.Host.CPU, h.CPU))
	}
	if p.Host.Cores != h.Cores {
		d = append(d, fmt.Sprintf("%d cores, not %d", p.Host.Cores, h.Cores))
	}
	return strings.Join(d, ", ")
}

// Default is the profile plan uses without a calibrated one: every product
// at peak/cores per thread (train.peak_flops), kernels at 2 GB/s per
// thread, collectives of 50 µs and 1 GB/s, no overlap. A guess that orders
// layouts by their work and bytes, stated as such by the command.
func Default(peakFLOPS float64) *Profile {
	h := ThisHost()
	one := peakFLOPS / float64(h.Cores)
	p := &Profile{Host: h, Elementwise: Pair{One: 2e9, All: 2e9 * float64(h.Cores)}}
	for _, c := range []float64{16, 1024} {
		p.MatMul = append(p.MatMul, MatMulRate{Class: c, FLOPS: Pair{One: one, All: peakFLOPS}})
	}
	return p
}

// matmulRate is the FLOP/s of a product of class c with t of the cores'
// share (t = cores / ranks, at most the cores): log-linear between the
// measured classes, clamped at the ends; between one thread and all,
// linear in the threads, at most the all-thread rate.
func (p *Profile) matmulRate(c, share float64) float64 {
	ms := p.MatMul
	at := func(f func(MatMulRate) float64) float64 {
		if c <= ms[0].Class {
			return f(ms[0])
		}
		for i := 1; i < len(ms); i++ {
			if c <= ms[i].Class {
				a, b := ms[i-1], ms[i]
				x := (math.Log(c) - math.Log(a.Class)) / (math.Log(b.Class) - math.Log(a.Class))
				return math.Exp((1-x)*math.Log(f(a)) + x*math.Log(f(b)))
			}
		}
		return f(ms[len(ms)-1])
	}
	return scaled(at(func(m MatMulRate) float64 { return m.FLOPS.One }), at(func(m MatMulRate) float64 { return m.FLOPS.All }), share)
}

// scaled is a rate with share cores: one thread's rate times the share,
// at most the all-thread rate.
func scaled(one, all, share float64) float64 {
	return min(one*share, max(all, one))
}

// collectiveIn is the seconds of op over a group of n of the world ranks
// moving bytes (commbench's size: the whole buffer), from the nearest
// measured group size of the backend (tcp when the backend was not
// measured); a model of 50 µs and 1 GB/s when nothing was. The ranks
// share the machine and compute between collectives: a member that waits
// is woken when the scheduler gives it a core back, which depends on how
// many ranks compete for the cores (the busy latency measured with world
// ranks), not on how many are in the group.
func (p *Profile) collectiveIn(backend, op string, n, world int, bytes float64) float64 {
	return p.collective(backend, op, n, world, bytes, -1)
}

// contendedIn is collectiveIn for a collective while ranks outside its
// group compute without waiting for it (another pipeline stage): a
// member that waits gets a core back when one of those ranks gives its
// own up, at the latest after the contended latency measured with world
// ranks (whose outsiders never wait), or after wake when they wait for
// their own collectives sooner.
func (p *Profile) contendedIn(backend, op string, n, world int, bytes, wake float64) float64 {
	return p.collective(backend, op, n, world, bytes, wake)
}

// collective is collectiveIn, and contendedIn for wake >= 0.
func (p *Profile) collective(backend, op string, n, world int, bytes, wake float64) float64 {
	if n < 2 {
		return 0
	}
	var best *CollectiveCost
	for i := range p.Collectives {
		c := &p.Collectives[i]
		if c.Op != op || (c.Backend != backend && backend != "") {
			continue
		}
		if best == nil || abs(c.N-n) < abs(best.N-n) {
			best = c
		}
	}
	if best == nil && backend != "tcp" {
		return p.collective("tcp", op, n, world, bytes, wake)
	}
	if best == nil && op == "all_to_all" && p.measured("all_gather") {
		// A profile from before calibrate measured all-to-all: an
		// all-gather moves the same bytes between the same ranks.
		return p.collective(backend, "all_gather", n, world, bytes, wake)
	}
	lat, bw := 50e-6, 1e9
	if best != nil {
		w := p.withWorld(best.Backend, op, world)
		lat, bw = max(best.Latency, w.Busy), best.BusBW
		if wake >= 0 {
			lat = max(lat, min(w.Contended, wake))
		}
	}
	return lat + bytes*busFactor(op, n)/bw
}

// withWorld is the entry of op measured with the number of ranks nearest
// world on the machine, whose busy and contended latencies a group
// inside the world waits (zero when none was measured).
func (p *Profile) withWorld(backend, op string, world int) CollectiveCost {
	var best *CollectiveCost
	for i := range p.Collectives {
		c := &p.Collectives[i]
		if c.Op == op && c.Backend == backend && (best == nil || abs(c.N-world) < abs(best.N-world)) {
			best = c
		}
	}
	if best == nil {
		return CollectiveCost{}
	}
	return *best
}

// measured says whether the profile holds op on some group.
func (p *Profile) measured(op string) bool {
	for _, c := range p.Collectives {
		if c.Op == op {
			return true
		}
	}
	return false
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// busFactor is the share of the buffer each rank sends (commbench's
// BusFactor).
func busFactor(op string, n int) float64 {
	switch op {
	case "all_reduce":
		return 2 * float64(n-1) / float64(n)
	case "all_gather", "reduce_scatter", "all_to_all":
		return float64(n-1) / float64(n)
	}
	return 1
}
