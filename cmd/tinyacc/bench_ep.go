package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strconv"

	"github.com/tinyacc/tinyacc/core/nn"
)

// arBytes is what one rank sends for an all-reduce of b bytes over n
// ranks on one host: every rank reads every other rank's buffer up to
// 32 KiB (the direct algorithm, (n-1)·b), a ring's 2(n-1)/n·b above.
func arBytes(n int, b float64) float64 {
	if b <= 32<<10 {
		return float64(n-1) * b
	}
	return 2 * float64(n-1) / float64(n) * b
}

// epCommBytes is the formula for the bytes one rank sends in a step of an
// expert-parallel run of m (MoE, fp32) with ep = dp = n, accum
// micro-batches, one DDP bucket, given the token rows the rank exchanged
// with the others by its routing (the step's expert_rows: rows sent to
// other ranks' experts plus rows received for its own):
//
//	rows     2 · 4C · expert_rows           each row crosses once per direction in the
//	                                        dispatch and once in the combine: forward, and
//	                                        their gradients backward
//	counts   blocks · accum · 8E · (n-1)/n  the per-expert counts (float64) of every forward
//	aux      blocks · accum · AR(8(2E+2))   the load-balancing statistics of every forward
//	load     blocks · AR(8(E+1))            expert_load and dropped counts, once a step
//	ddp      AR(4Ψr) + AR(8) + AR(16)       the gradients of the Ψr parameters every rank
//	                                        holds (the experts are n ways apart: no
//	                                        replicas), the loss, the gradient norm
//
// AR(b) is arBytes; blocks the MoE blocks, E the experts, C the width.
func epCommBytes(m nn.GPTConfig, n, accum int, rows float64) float64 {
	return epRoutingBytes(m, n, accum, rows) + arBytes(n, 4*float64(replicatedParams(m))) + arBytes(n, 8) + arBytes(n, 16)
}

// epRoutingBytes is epCommBytes's rows, counts, aux and load terms: what
// the routing itself sends over the expert-parallel group.
func epRoutingBytes(m nn.GPTConfig, n, accum int, rows float64) float64 {
	C, E := float64(m.NEmbd), float64(m.MoE.Experts)
	blocks := float64(moeBlocks(m))
	f := 2*4*C*rows + blocks*float64(accum)*8*E*float64(n-1)/float64(n)
	if m.MoE.AuxLossCoef > 0 || m.MoE.ZLossCoef > 0 {
		f += blocks * float64(accum) * arBytes(n, 8*(2*E+2))
	}
	return f + blocks*arBytes(n, 8*(E+1))
}

// moeBlocks is the number of MoE blocks of m.
func moeBlocks(m nn.GPTConfig) int {
	k := 0
	for i := 0; i < m.NLayer; i++ {
		if m.MoE.IsMoE(i) {
			k++
		}
	}
	return k
}

// replicatedParams is Ψ less the experts: what every rank holds under
// expert parallel.
func replicatedParams(m nn.GPTConfig) int64 {
	C := int64(m.NEmbd)
	return m.NumParams() - int64(moeBlocks(m))*int64(m.MoE.Experts)*(8*C*C+5*C)
}

// epRun is one run of `bench ep`.
type epRun struct {
	name  string
	model nn.GPTConfig
	flags []string
}

// benchEP trains, on N tcp processes over the same data, a dense GPT and
// a MoE GPT with the same parameters per token (8 experts, top-2: a
// block's active MLP is two experts, so 3 MoE blocks match 5 dense ones
// but for the router and biases), under expert parallel ep = N, with and
// without the load-balancing loss, and prints ms/step, tokens/s, the bytes
// rank 0 sent per step beside epCommBytes (every step compared), rank 0's
// parameter bytes, and the load balance of the last step: max/mean tokens
// per expert, the worst MoE block.
func benchEP(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench ep", flag.ContinueOnError)
	nproc := fs.Int("nproc", 4, "ranks (dp = ep)")
	steps := fs.Int("steps", 200, "training steps per run (the first is not timed)")
	batch := fs.Int("batch", 4, "sequences per rank per step")
	width := fs.Int("n_embd", 64, "model width")
	context := fs.Int("block_size", 64, "context")
	keep := fs.String("keep", "", "directory to keep the runs' metrics in (default: a temporary one)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	n := *nproc
	if n < 2 || 8%n != 0 {
		return fmt.Errorf("bench ep: --nproc %d: expert parallel over 8 experts needs 2, 4 or 8 ranks", n)
	}
	dir, exe, done, err := benchFiles(*keep, "ep")
	if err != nil {
		return err
	}
	defer done()
	base := nn.GPTConfig{NLayer: 5, NHead: 4, NEmbd: *width, BlockSize: *context, VocabSize: 256}
	moe := base
	moe.NLayer = 3
	moe.MoE = nn.MoEConfig{Experts: 8, TopK: 2, Every: 1, AuxLossCoef: 0.01}
	noAux := moe
	noAux.MoE.AuxLossCoef = 0
	moeFlags := func(m nn.GPTConfig) []string {
		return []string{"--model.moe.experts=8", "--model.moe.top_k=2", "--parallel.ep=" + strconv.Itoa(n),
			"--model.moe.aux_loss_coef=" + strconv.FormatFloat(m.MoE.AuxLossCoef, 'g', -1, 64)}
	}
	runs := []epRun{
		{"dense", base, nil},
		{"moe aux 0.01", moe, moeFlags(moe)},
		{"moe aux 0", noAux, moeFlags(noAux)},
	}
	fmt.Fprintf(stdout, "%d ranks, tcp; %d sequences of %d tokens per rank per step, %d steps; dense GPT %d layers, MoE GPT %d layers × 8 experts top-2, n_embd %d\n",
		n, *batch, *context, *steps, base.NLayer, moe.NLayer, *width)
	fmt.Fprintf(stdout, "%-13s %8s %8s %9s %10s %13s %13s %9s %13s %14s\n", "run", "Ψ (M)", "active", "ms/step", "tokens/s", "comm B/step", "formula B", "max diff", "param B/rank", "load max/mean")
	var off []string
	for _, r := range runs {
		metrics := filepath.Join(dir, fmt.Sprintf("ep-%s.jsonl", r.name[:3]+strconv.Itoa(len(r.flags))+r.name[len(r.name)-1:]))
		argv := trainArgs(exe, r.model, *batch, *steps, append([]string{"--train.schedule=constant", "--ddp.first_bucket_mb=0",
			"--train.log_every=" + strconv.Itoa(*steps), "--metrics_file=" + metrics}, r.flags...)...)
		if err := launchTrain("ep", r.name, n, argv, stderr); err != nil {
			return err
		}
		lines, err := readMetrics(metrics)
		if err != nil {
			return err
		}
		var ms, tps, comm []float64
		var worst, params, balance float64
		for _, l := range lines {
			switch {
			case l.Kind == "train" && l.Step > 1:
				ms, tps, comm = append(ms, l.StepMS), append(tps, l.TPS), append(comm, l.Comm)
				f := arBytes(n, 4*float64(r.model.NumParams())) + arBytes(n, 8) + arBytes(n, 16)
				if r.model.MoE.Experts > 0 {
					f = epCommBytes(r.model, n, 1, l.ExpertRows)
				}
				worst = math.Max(worst, math.Abs(l.Comm-f))
				if l.Step == *steps {
					balance = loadBalance(l.ExpertLoad)
				}
			case l.Kind == "memory" && l.Rank == 0:
				params = l.Params
			}
		}
		if len(comm) == 0 {
			return fmt.Errorf("bench ep: %s: no timed steps in %s", r.name, metrics)
		}
		formula := "-"
		if r.model.MoE.Experts > 0 {
			formula = "per step"
		}
		bal := "-"
		if balance > 0 {
			bal = fmt.Sprintf("%.3f", balance)
		}
		fmt.Fprintf(stdout, "%-13s %8.3f %8.3f %9.1f %10.0f %13.0f %13s %9.0f %13.0f %14s\n", r.name, float64(r.model.NumParams())/1e6, float64(r.model.ActiveParams())/1e6,
			median(ms), median(tps), median(comm), formula, worst, params, bal)
		if worst > 0 {
			off = append(off, fmt.Sprintf("%s: a step sent %.0f bytes away from the formula", r.name, worst))
		}
	}
	fmt.Fprintln(stdout, "comm: median payload bytes rank 0 sent per step; max diff: the largest |measured - formula| over the timed steps (formula: epCommBytes in cmd/tinyacc/bench_ep.go, fed each step's expert_rows; dense: AR(4Ψ) + AR(8) + AR(16))")
	fmt.Fprintln(stdout, "load max/mean: the last step's tokens per expert, max over mean, the worst MoE block")
	if len(off) > 0 {
		return fmt.Errorf("bench ep: measured communication differs from the formula: %v", off)
	}
	return nil
}

// loadBalance is the largest max/mean of tokens per expert over the
// blocks of an expert_load field.
func loadBalance(load [][]float64) float64 {
	var worst float64
	for _, b := range load {
		var sum, top float64
		for _, x := range b {
			sum += x
			top = math.Max(top, x)
		}
		if sum > 0 {
			worst = math.Max(worst, top/(sum/float64(len(b))))
		}
	}
	return worst
}
