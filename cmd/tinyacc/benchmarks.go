package main

import (
	"fmt"
	"io"
	"strings"
)

// benchmark is one `tinyacc bench NAME`: its help block and what runs it.
// benchmarks is the only list of them: `tinyacc --help`, `bench --help`,
// the dispatch and the unknown-benchmark error all read it, so a new
// benchmark is one entry here and cannot be missing from any of them.
type benchmark struct {
	name string
	// help follows "  tinyacc bench NAME": its flags, then lines indented
	// six spaces that say what it measures.
	help string
	run  func(args []string, stdout, stderr io.Writer) error
}

var benchmarks = []benchmark{
	{"step", ` [--steps N] [--repeats R] [--threads 1,2] [--precision fp32,bf16,bf16-portable,fp16] [--json]
      Time a training step of the same GPT in tinyacc and in PyTorch, in fp32
      and in bf16 (PyTorch under autocast bf16); bf16-portable (against
      autocast too) and fp16 (no PyTorch peer) take the portable
      half-precision path. Each repeat runs the precisions in turn; the
      last lines give each one's tokens/s against fp32's, run by run.`, benchStep},
	{"comm", ` [--nproc N] [--backend tcp|local] [--op all_reduce|all_gather|
                     reduce_scatter|broadcast|all_to_all|memcpy] [--sizes 4K,64K,1M,16M,64M] [--json]
      Time a collective: size, time, algbw and busbw (nccl-tests definitions).`, benchComm},
	{"dp", ` [--nproc 2,4] [--steps N]
      DDP naive/bucketed and ZeRO-1/2/3 on N processes: ms/step, communication
      hidden behind compute, steady memory per rank beside the formula.`, benchDP},
	{"layouts", ` [--nproc N] [--steps N] [--repeats R] [--batch B] [--keep DIR]
      One model on one global batch as one process and under every parallel
      layout on N processes: ms/step, tokens/s, bytes sent per step beside the
      formula, parameter bytes and activation peak against one process's.`, benchLayouts},
	{"ep", ` [--nproc 4] [--steps 200] [--batch B] [--n_embd C] [--block_size T]
      A dense GPT and a MoE GPT with the same parameters per token (8 experts,
      top-2) under expert parallel on N processes, with and without the
      load-balancing loss: ms/step, tokens/s, bytes sent per step against the
      formula at every step, parameter bytes per rank, load balance.`, benchEP},
	{"pp", ` [--micro 2,4,8] [--steps N]
      Pipeline schedules on 2 processes: ms/step, idle share of wall time from
      the trace beside the simulator's and the formula's, activation peaks.`, benchPP},
	{"cp", ` [--nproc N] [--steps N]
      Context parallel: attention FLOPs and time per rank under the zigzag and
      contiguous splits, the ring's transfer time hidden behind compute (cp 2,
      2 processes), activation peak per rank beside one process's.`, benchCP},
	{"soak", ` [--steps 20000] [--nproc 4] [--peer BIN] [-- TRAIN FLAGS]
      Train a tiny GPT for N steps, one process and --nproc 4, printing every
      process's resident memory every N/20 steps and its slope in MB per 1000
      steps (beside BIN's, with --peer).`, benchSoak},
	{"ckpt", ` [--nproc N] [--zero S] [--models demo,85m] [--dir DIR]
      Save and resume the whole training state under ZeRO on N goroutine
      ranks: seconds, bytes on disk beside 12Ψ, memory a save adds per rank.
      The 85m model needs about 12 GB of memory; --models demo needs little.`, benchCkpt},
	{"process", ` [--calls N] [--steps N] [--rounds R]
      What a plugin run as a process costs: one hook call's round trip, one
      GradReady notice, and ms/step of DDP compiled in against ddp.process.`, benchProcess},
	{"memory", ` [--nproc 4] [--batch 1] [--layouts 0,1,2,3,4] [--precision no,bf16] [--n_layer ...]
                       [--model.arch llama [--n_kv_head K] [--intermediate_size F]] [--json]
      One training step per layout (1 process, zero-3 dp N, tp N, pp N 1f1b,
      zero-1 dp N) of GPT-2 medium's shape by default (or a Llama of the
      shape), in each precision:
      per rank the resident peak (VmHWM) beside the estimate, the Playbook
      formula plus stated buffers and one process's peak on the same global
      batch, with the ratios, and the allocator's parameters, optimizer
      state and peak against the estimate's.`, benchMemory},
	{"precision", ` [--steps 300] [--precision no,bf16,fp16] [--within 0.02] [--json] [-- TRAIN FLAGS]
      Train the demo model once per train.mixed_precision from the same seed
      and data: final and evaluation losses beside fp32's, and whether each
      ends within 2% of fp32's final loss.`, benchPrecision},
	{"torch", ` [--nproc N] [--steps N] [--repeats R] [--batch B] [--threads T]
      The same torch model on N processes through tinyacc's Accelerator and
      through torch DistributedDataParallel (gloo): ms/step and memory per
      ZeRO stage.`, benchTorch},
	{"recompute", ` [--steps N] [--rounds R] [--batch 1,8] [--shapes gpt2,demo]
      Activation recomputation none / selective / full / full on half the
      blocks, one process, at GPT-2 small's shape and the demo shape: ms/step
      and activation peak (measured and estimated) beside none's.`, benchRecompute},
	{"lora", ` [--steps N] [--block_size 64] [--n_layer 12] [--n_embd 768] [--rank 8] [--zero 2] [--dir DIR]
      A base of GPT-2 small's shape saved by a short run, fine-tuned on 2 ranks
      under ZeRO-2 in full and with LoRA rank 8 on c_attn: ms/step, gradient +
      optimizer bytes and bytes sent per step per rank, LoRA's share of full's.`, benchLoRA},
}

// benchNames is "step, comm, ..." in the table's order.
func benchNames(sep string) string {
	names := make([]string, len(benchmarks))
	for i, b := range benchmarks {
		names[i] = b.name
	}
	return strings.Join(names, sep)
}

// benchUsage is every benchmark's help block, as the usage text shows them.
func benchUsage() string {
	var b strings.Builder
	for _, bm := range benchmarks {
		b.WriteString("  tinyacc bench " + bm.name + bm.help + "\n")
	}
	return b.String()
}

func cmdBench(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: tinyacc bench %s [flags]", benchNames("|"))
	}
	for _, b := range benchmarks {
		if b.name == args[0] {
			return b.run(args[1:], stdout, stderr)
		}
	}
	return fmt.Errorf("bench: unknown benchmark %q (have: %s)", args[0], benchNames(", "))
}
