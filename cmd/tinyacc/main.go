// Command tinyacc trains GPT models with tinyacc's engine.
//
//	tinyacc train [--config FILE] [--key=value ...]   train (see `tinyacc config show`)
//	tinyacc sample --from FILE.safetensors [--prompt S] [--tokens N]
//	tinyacc config show [--config FILE] [--key=value ...]
//	tinyacc export --from CHECKPOINT --to FILE.safetensors
//	tinyacc export --lora|--merge-lora --from CHECKPOINT --to DIR|FILE
//	tinyacc ckpt inspect CHECKPOINT
//	tinyacc plan --nproc 4 [--verify K]                the fastest layouts that fit, predicted
//	tinyacc pp draw --pp 4 --micro 8 --schedule 1f1b   a pipeline schedule's timeline
//	tinyacc bench step                                  tinyacc vs PyTorch, ms/step
//	tinyacc launch --nproc N -- PROGRAM ARGS...         start N ranks
//	tinyacc launch --nproc_per_node N SCRIPT.py ARGS... (torchrun's spelling)
//	tinyacc version
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/launch"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
	"github.com/tinyacc/tinyacc/plugins/process"
)

// Version is tinyacc's release.
const Version = "0.1.0"

// usageText is the whole help; the benchmarks come from their table.
func usageText() string {
	return usageHead + benchUsage() + usageTail
}

const usageHead = `tinyacc: a distributed training engine for GPT models.

Usage:
  tinyacc train [--config FILE] [--nproc N | --local-ranks N] [--key=value ...]
      Train a GPT. With no arguments: the default model on the default corpus
      (the Go toolchain's own sources). Every config key can be given as a flag,
      e.g. --model.n_layer=2 --train.steps=100; see 'tinyacc config show'.
      --nproc N launches N processes of itself (tcp backend); --local-ranks N
      runs N ranks as goroutines of this process (local backend, for debugging).
      --trace FILE writes one Perfetto trace with a track per rank.
      --max-restarts K restarts a failed --nproc job from its latest checkpoint.
      data.path is a text file, a directory of text files or token shards (a
      glob); data.max_bytes caps the text read from it (8 MiB by default; 0 is
      no cap: every byte is read). Devices and pipes are refused.
      Before anything starts, the layout and the memory estimate are checked
      against memory.limit (auto, a size such as 8GiB, or 0 for no check).
  tinyacc estimate [--config FILE] [--nproc N | --local-ranks N] [--json] [--key=value ...]
      Print each rank's memory (parameters, gradients, optimizer state,
      activations, communication, data, set-up and peak) for the run train
      would start with the same arguments, without starting it. --json: one
      JSON object per rank, one per line.
  tinyacc plan --nproc N [--top K] [--json] [--profile FILE] [--verify K]
               [--rounds R] [--keep DIR] [--config FILE] [--key=value ...]
      Search the layouts of N ranks (dp, tp, pp, cp, ZeRO stage, pipeline
      schedule, virtual stages, micro-batches, recomputation) for the run
      train would start with the same keys, at its global batch: keep those
      whose memory estimate fits memory.limit, predict each one's step from
      the machine's profile, print the fastest K (default 10) and one line
      per rule that excluded layouts. --json: one layout per line with the
      flags that start it. --verify K runs the top K and K at random, 5
      steps each (--rounds R: R times in turns, the median), predicted
      against measured (docs/plan.md).
  tinyacc plan calibrate [--profile FILE] [--nproc N]
      Measure this machine for plan's cost model (matrix products, kernels,
      collectives, overlap); the profile goes to the user's cache directory.
  tinyacc tokenize --in FILE --out FILE.bin
      Write a token shard (llm.c's .bin layout) from text with the byte
      tokenizer; train reads it with data.path=FILE.bin.
  tinyacc plot METRICS.jsonl... --to FILE.svg
      Draw train and eval loss, learning rate, gradient norm and tokens/s
      against step from metrics_file outputs, one colour per run.
  tinyacc sample --from FILE.safetensors [--prompt TEXT] [--tokens N]
                 [--temperature T] [--top_k K] [--seed S]
      Generate text from trained weights.
  tinyacc config show [--config FILE] [--key=value ...]
      Print the resolved config and where each value came from.
  tinyacc export --from CHECKPOINT --to FILE.safetensors
      Write a checkpoint's weights as one safetensors file (a Llama's
      with Hugging Face's config.json beside it).
  tinyacc export --lora --from CHECKPOINT --to DIR
      Write a LoRA checkpoint's adapters as Hugging Face PEFT does:
      DIR/adapter_model.safetensors and DIR/adapter_config.json.
  tinyacc export --merge-lora --from CHECKPOINT --to FILE.safetensors [--base FILE]
      Write a LoRA checkpoint's base (its init_from) with the adapters merged in.
  tinyacc ckpt inspect CHECKPOINT
      List a checkpoint's tensors, shapes, layout and step; verify every digest.
  tinyacc pp draw --pp N --micro M [--schedule afab|1f1b|interleaved|zb1]
                 [--virtual V] [--svg FILE] | --trace FILE [--step S]
      Draw a pipeline schedule (or a traced run's step) as a timeline, one row
      per rank, with its bubble beside the formula.
`

const usageTail = `  tinyacc launch --nproc N [--nnodes M --node-rank R --master-addr A
                 --master-port P] [--max-restarts K] -- PROGRAM ARGS...
  tinyacc launch --nproc_per_node N [torchrun's flags] SCRIPT.py ARGS...
      Start N ranks of any program with the torchrun environment variables;
      a .py script given first runs with --python (default /usr/bin/python3).
  tinyacc version

Every command takes -h or --help. Config keys: 'tinyacc config show' lists
every key with its value and source; README.md explains them.
`

// configHint ends every command's help.
const configHint = "\nConfig keys: 'tinyacc config show' lists every key with its value and source;\nREADME.md explains them. Layers: defaults < --config FILE < TINYACC_* variables < flags.\n"

// commandUsage is the part of usage about cmd (every block whose first
// line starts "  tinyacc CMD").
func commandUsage(cmd string) string {
	var b strings.Builder
	in := false
	for _, line := range strings.Split(usageText(), "\n") {
		if strings.HasPrefix(line, "  tinyacc ") {
			in = strings.HasPrefix(line, "  tinyacc "+cmd+" ") || line == "  tinyacc "+cmd
		} else if !strings.HasPrefix(line, "    ") {
			in = false
		}
		if in {
			b.WriteString(line + "\n")
		}
	}
	return "Usage:\n" + b.String()
}

// wantsHelp reports whether args ask for help (-h, --help or help first).
func wantsHelp(args []string) bool {
	for _, a := range args {
		if a == "--" || strings.HasSuffix(a, ".py") {
			return false // a launched program's own flags
		}
		if a == "-h" || a == "--help" {
			return true
		}
	}
	return len(args) > 0 && args[0] == "help"
}

func main() {
	process.ServeBuiltin() // when started as a plugin process (ddp.process)
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText())
		return 2
	}
	switch args[0] {
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usageText())
		return 0
	}
	if wantsHelp(args[1:]) {
		if u := commandUsage(args[0]); u != "Usage:\n" {
			fmt.Fprint(stdout, u+configHint)
			return 0
		}
	}
	var err error
	switch args[0] {
	case "train":
		err = cmdTrain(args[1:], stdout, stderr)
	case "tokenize":
		err = cmdTokenize(args[1:], stdout)
	case "plot":
		err = cmdPlot(args[1:], stdout)
	case "estimate":
		err = cmdEstimate(args[1:], stdout, stderr)
	case "plan":
		err = cmdPlan(args[1:], stdout, stderr)
	case "sample":
		err = cmdSample(args[1:], stdout)
	case "config":
		if len(args) < 2 || args[1] != "show" {
			err = errors.New("usage: tinyacc config show [--config FILE] [--key=value ...]")
		} else {
			err = cmdConfigShow(args[2:], stdout)
		}
	case "bench":
		err = cmdBench(args[1:], stdout, stderr)
	case "pp":
		err = cmdPP(args[1:], stdout)
	case "export":
		err = cmdExport(args[1:], stdout)
	case "ckpt":
		err = cmdCkpt(args[1:], stdout)
	case "launch":
		return launch.Main(args[1:], stdout, stderr)
	case "version", "--version":
		fmt.Fprintf(stdout, "tinyacc %s (%s, %s/%s, blas %s)\n", Version, runtime.Version(), runtime.GOOS, runtime.GOARCH, cpu.BLASName())
	default:
		fmt.Fprintf(stderr, "tinyacc: unknown command %q\n\n%s", args[0], usageText())
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "tinyacc: %v\n", err)
		// 1, or what a launched job's failure carries: the failed rank's
		// code, or 128+signal.
		return launch.ExitCode(err)
	}
	return 0
}

// splitConfigFlag takes --config FILE (or --config=FILE) out of args.
func splitConfigFlag(args []string) (file string, rest []string, err error) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--config":
			if i+1 >= len(args) {
				return "", nil, errors.New("--config needs a file name")
			}
			file = args[i+1]
			i++
		case strings.HasPrefix(a, "--config="):
			file = strings.TrimPrefix(a, "--config=")
		default:
			rest = append(rest, a)
		}
	}
	return file, rest, nil
}

func loadConfig(args []string) (*config.Resolved, error) {
	file, rest, err := splitConfigFlag(args)
	if err != nil {
		return nil, err
	}
	return config.LoadWith(file, os.Environ(), rest, process.Declare)
}

func cmdConfigShow(args []string, stdout io.Writer) error {
	r, err := loadConfig(args)
	if err != nil {
		return err
	}
	return r.Show(stdout)
}
