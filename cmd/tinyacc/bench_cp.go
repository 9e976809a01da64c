package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
	"github.com/tinyacc/tinyacc/core/trace"
	"github.com/tinyacc/tinyacc/plugins/cp"
)

// cpCommBytes is what a rank of a cp N layout (nothing else parallel)
// sends per step, fp32, with b sequences per micro-batch, context s,
// width h, L layers, Ψ parameters, Tl = s/N rows per rank:
//
//	ring       per layer: forward N-1 key/value blocks of 2·b·Tl·h elements,
//	           backward N-1 blocks again and N gradient blocks:
//	           e · 2·b·Tl·h · (3N-2)
//	allgather  per layer: an all-gather and a reduce-scatter of the
//	           N·2·b·Tl·h-element whole: 2 · (N-1)/N · e · N·2·b·Tl·h
//
// (e = 4 bytes an element, 2 under mixed precision, whose blocks travel in
// the compute dtype)
//
// plus, as for dp N: the gradients averaged over the DP × CP group
// (2(N-1)/N · 4Ψ), the loss twice (the forward's CP mean and DDP's, 8
// bytes each at 2(N-1)/N) and the gradient norm.
func cpCommBytes(ring bool) func(b layoutBench, n int) float64 {
	return func(b layoutBench, n int) float64 {
		N := float64(n)
		ar := 2 * (N - 1) / N
		blk := 2 * float64(b.global) * float64(b.model.BlockSize) / N * float64(b.model.NEmbd) // floats of one block
		perLayer := float64(b.act()) * blk * (3*N - 2)
		if !ring {
			perLayer = 2 * (N - 1) / N * float64(b.act()) * N * blk
		}
		return float64(b.model.NLayer)*perLayer + ar*4*float64(b.model.NumParams()) + 2*ar*8 + b.normBytes(n)
	}
}

// attentionFLOPs is the attention work of one training step of a rank
// whose queries see pairs (query, key) pairs per sequence: per pair and
// head of hs columns, 4·hs forward (the score and the weighted value) and
// 10·hs backward (the recomputed score, dP, dV, dQ, dK); C = heads·hs.
func attentionFLOPs(m nn.GPTConfig, batch int, pairs int64) float64 {
	return 14 * float64(m.NEmbd) * float64(m.NLayer) * float64(batch) * float64(pairs)
}

// benchCP measures context parallel against its peers, each run a job of
// `tinyacc train` processes over tcp on the same model and global batch:
//
//   - balance: cp N with the zigzag and the contiguous split, per rank the
//     attention FLOPs (counted from the positions it holds, cp.Pairs) and
//     the attention time, measured twice: in the run (the trace's cp block
//     spans, forward and backward, which machine load and the ranks'
//     competition for cores colour) and alone (cp.TimeRank: one rank's
//     blocks at a time, one thread, the fastest of interleaved rounds),
//     with max/min over the ranks;
//   - overlap: cp 2 ring on 2 processes, the share of the ring's transfer
//     time (the trace's cp kv/dkv spans, from issue to completion) that
//     overlaps block compute on the same rank;
//   - memory: each layout's activation peak per rank (the allocator's)
//     over one process's, beside 1/N.
func benchCP(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench cp", flag.ContinueOnError)
	nproc := fs.Int("nproc", 4, "ranks of the balance runs (cp = nproc)")
	steps := fs.Int("steps", 4, "training steps per run")
	reps := fs.Int("repeats", 15, "interleaved timings of each rank's attention alone (the fastest is reported)")
	var b layoutBench
	keep := b.flags(fs, nn.GPTConfig{NLayer: 2, NHead: 4, NEmbd: 128, BlockSize: 512, VocabSize: 256}, 2)
	if err := b.parse(fs, args); err != nil {
		return err
	}
	n := *nproc
	if n < 2 {
		return fmt.Errorf("bench cp: --nproc %d: context parallel needs 2 or more ranks", n)
	}
	if *steps < 2 {
		return fmt.Errorf("bench cp: --steps %d: need 2 or more", *steps)
	}
	dir, exe, done, err := benchFiles(*keep, "cp")
	if err != nil {
		return err
	}
	defer done()
	type run struct {
		tag   string
		procs int
		flags []string
	}
	runs := []run{
		{"one", 1, nil},
		{"zigzag", n, []string{"--parallel.cp=" + strconv.Itoa(n), "--cp.split=zigzag"}},
		{"contiguous", n, []string{"--parallel.cp=" + strconv.Itoa(n), "--cp.split=contiguous"}},
		{"ring2", 2, []string{"--parallel.cp=2", "--cp.attention=ring"}},
		{"allgather2", 2, []string{"--parallel.cp=2", "--cp.attention=allgather"}},
	}
	fmt.Fprintf(stdout, "GPT n_layer %d n_head %d n_embd %d context %d vocab %d; global batch %d sequences; %d steps; tcp backend\n",
		b.model.NLayer, b.model.NHead, b.model.NEmbd, b.model.BlockSize, b.model.VocabSize, b.global, *steps)
	acts := map[string][]float64{}
	traces := map[string]string{}
	for _, r := range runs {
		metrics := filepath.Join(dir, r.tag+".jsonl")
		argv := trainArgs(exe, b.model, b.global, *steps, append([]string{"--train.schedule=constant", "--metrics_file=" + metrics}, r.flags...)...)
		if r.procs > 1 {
			traces[r.tag] = filepath.Join(dir, r.tag+".json")
			argv = append(argv, "--trace="+traces[r.tag])
		}
		if err := launchTrain("cp", r.tag, r.procs, argv, stderr); err != nil {
			return err
		}
		if acts[r.tag], err = rankActivations(metrics, r.procs); err != nil {
			return err
		}
	}

	fmt.Fprintf(stdout, "\nbalance: cp %d, attention per rank per step: FLOPs counted from the positions held; time measured in the run (cp block spans, forward + backward, %d processes sharing this machine) and alone (one rank at a time in this process, 1 thread, fastest of %d interleaved rounds)\n", n, n, *reps)
	fmt.Fprintf(stdout, "%-11s %4s %-16s %10s %11s %10s %10s\n", "split", "rank", "chunks", "pairs/seq", "GFLOP/step", "run ms", "alone ms")
	for _, split := range []string{cp.Zigzag, cp.Contiguous} {
		pos, err := cp.AllPositions(split, b.model.BlockSize, n)
		if err != nil {
			return err
		}
		evs, err := rankTraces(traces[split], n)
		if err != nil {
			return err
		}
		var flops, ms []float64
		// Rounds over the ranks in turn, so that load from elsewhere hits
		// every rank alike; the fastest round of each rank is its cost.
		alone := make([]float64, n)
		prev := cpu.Threads()
		cpu.SetThreads(1)
		for k := 0; k < *reps; k++ {
			for r := range pos {
				d, _ := cp.TimeRank(b.global, b.model.NHead, b.model.NEmbd, pos, r)
				t := float64(b.model.NLayer) * float64(d.Microseconds()) / 1e3
				if k == 0 || t < alone[r] {
					alone[r] = t
				}
			}
		}
		cpu.SetThreads(prev)
		for r := range pos {
			var pairs int64
			for j := range pos {
				pairs += cp.Pairs(pos[r], pos[j])
			}
			f := attentionFLOPs(b.model, b.global, pairs)
			var us float64
			for _, e := range evs[r] {
				if e.TID == trace.Compute && strings.HasPrefix(e.Name, "cp block") {
					us += e.Dur
				}
			}
			t := us / 1e3 / float64(*steps)
			flops, ms = append(flops, f), append(ms, t)
			fmt.Fprintf(stdout, "%-11s %4d %-16s %10d %11.3f %10.2f %10.2f\n", split, r, chunkNames(split, n, r), pairs, f/1e9, t, alone[r])
		}
		fmt.Fprintf(stdout, "%-11s max/min: FLOPs %.3f, time in the run %.3f, time alone %.3f\n", split, maxOverMin(flops), maxOverMin(ms), maxOverMin(alone))
	}

	fmt.Fprintf(stdout, "\noverlap: cp 2 ring, 2 processes: ring transfers (cp kv, cp dkv spans) hidden behind block compute (cp block spans)\n")
	evs, err := rankTraces(traces["ring2"], 2)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%4s %12s %12s %9s\n", "rank", "transfer ms", "hidden ms", "hidden")
	var allT, allH float64
	for r, e := range evs {
		tr, hid := ringOverlap(e)
		allT, allH = allT+tr, allH+hid
		fmt.Fprintf(stdout, "%4d %12.2f %12.2f %8.1f%%\n", r, tr/1e3, hid/1e3, 100*hid/max(tr, 1e-9))
	}
	fmt.Fprintf(stdout, "%4s %12.2f %12.2f %8.1f%%\n", "all", allT/1e3, allH/1e3, 100*allH/max(allT, 1e-9))

	fmt.Fprintf(stdout, "\nactivation peak per rank (allocator) over one process's %.2f MiB, beside 1/cp\n", acts["one"][0]/(1<<20))
	fmt.Fprintf(stdout, "%-22s %8s %8s %8s\n", "layout", "min", "max", "1/cp")
	for _, row := range []struct {
		name, tag string
		cp        int
	}{
		{fmt.Sprintf("cp %d ring zigzag", n), "zigzag", n},
		{fmt.Sprintf("cp %d ring contiguous", n), "contiguous", n},
		{"cp 2 ring", "ring2", 2},
		{"cp 2 allgather", "allgather2", 2},
	} {
		a := acts[row.tag]
		lo, hi := a[0], a[0]
		for _, v := range a {
			lo, hi = min(lo, v), max(hi, v)
		}
		base := acts["one"][0]
		fmt.Fprintf(stdout, "%-22s %7.3fx %7.3fx %7.3fx\n", row.name, lo/base, hi/base, 1/float64(row.cp))
	}
	fmt.Fprintln(stdout, "below 1/cp: one process keeps the attention probabilities (B·H·T² per layer), a CP rank only the log-sum-exp; above it: the weight-gradient buffers and wpe's gradient stay whole on every rank, and the all-gather form keeps the whole sequence's keys and values per layer")
	return nil
}

// chunkNames says which chunks of the split rank r holds.
func chunkNames(split string, n, r int) string {
	if split == cp.Zigzag {
		return fmt.Sprintf("%d and %d of %d", r, 2*n-1-r, 2*n)
	}
	return fmt.Sprintf("%d of %d", r, n)
}

func maxOverMin(xs []float64) float64 {
	lo, hi := xs[0], xs[0]
	for _, x := range xs {
		lo, hi = min(lo, x), max(hi, x)
	}
	return hi / lo
}

// ringOverlap is the ring's transfer time on one rank and the part of it
// that overlaps the rank's block compute (µs).
func ringOverlap(evs []trace.Event) (transfer, hidden float64) {
	var ring []trace.Event
	for _, e := range evs {
		if (e.TID == trace.Compute && strings.HasPrefix(e.Name, "cp block")) || (e.TID == trace.Comm && (e.Name == "cp kv" || e.Name == "cp dkv")) {
			ring = append(ring, e)
		}
	}
	share := HiddenShare(ring)
	for _, e := range ring {
		if e.TID == trace.Comm {
			transfer += e.Dur
		}
	}
	return transfer, share * transfer
}

// rankTraces reads a run's merged trace: the events of each of its n ranks.
func rankTraces(path string, n int) ([][]trace.Event, error) {
	out, err := trace.ReadRanks(path)
	if err != nil {
		return nil, err
	}
	if len(out) != n {
		return nil, fmt.Errorf("%s: the trace holds %d ranks, want %d", path, len(out), n)
	}
	return out, nil
}

// rankActivations reads every rank's activation peak from a metrics file.
func rankActivations(path string, n int) ([]float64, error) {
	lines, err := readMetrics(path)
	if err != nil {
		return nil, err
	}
	out := make([]float64, n)
	seen := 0
	for _, m := range lines {
		if m.Kind == "memory" && m.Rank >= 0 && m.Rank < n {
			out[m.Rank] = m.Act
			seen++
		}
	}
	if seen < n {
		return nil, errors.New(path + ": fewer memory entries than ranks")
	}
	return out, nil
}
