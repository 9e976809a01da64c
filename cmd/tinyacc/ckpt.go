package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// cmdExport writes a checkpoint's weights as one safetensors file (and a
// Llama's config.json beside it).
func cmdExport(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("export", flag.ContinueOnError)
	from := fs.String("from", "", "checkpoint directory (step-NNNNNNN, or a checkpoint root for its latest)")
	to := fs.String("to", "", "safetensors file to write (a directory with --lora)")
	dtype := fs.String("dtype", "", "dtype of the written weights: fp32 or bf16 (default: the checkpoint's, float32 or float64)")
	lora := fs.Bool("lora", false, "a LoRA checkpoint's adapters as a PEFT adapter directory (adapter_model.safetensors, adapter_config.json)")
	merge := fs.Bool("merge-lora", false, "a LoRA checkpoint's base with its adapters merged in, as one weights file")
	base := fs.String("base", "", "with --merge-lora: the base weights (default: the run's init_from)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dtype != "" && *dtype != "fp32" && *dtype != "bf16" {
		return fmt.Errorf("export: --dtype %q: use fp32 or bf16", *dtype)
	}
	if *dtype != "" && (*lora || *merge) {
		return errors.New("export: --dtype applies to a checkpoint's weights, not to --lora or --merge-lora")
	}
	if *from == "" || *to == "" || (*lora && *merge) || (*base != "" && !*merge) {
		return errors.New("usage: tinyacc export --from CHECKPOINT --to model.safetensors [--dtype fp32|bf16]\n       tinyacc export --lora --from CHECKPOINT --to DIR\n       tinyacc export --merge-lora --from CHECKPOINT --to model.safetensors [--base BASE.safetensors]")
	}
	dir, err := ckpt.Resolve(*from)
	if err != nil {
		return err
	}
	switch {
	case *lora:
		if err := trainer.ExportLoRA(dir, *to); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "tinyacc: exported the adapters of %s to %s (%s, %s)\n", dir, *to, trainer.AdapterWeightsFile, trainer.AdapterConfigFile)
		return nil
	case *merge:
		if err := trainer.ExportMerged(dir, *base, *to); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "tinyacc: merged the adapters of %s into their base: %s\n", dir, *to)
		return nil
	}
	if err := trainer.ExportCheckpointAs(dir, *to, *dtype); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "tinyacc: exported %s to %s\n", dir, *to)
	if ix, err := ckpt.ReadIndex(dir); err == nil {
		if mc, err := trainer.CheckpointModel(ix); err == nil && mc.Llama != nil {
			fmt.Fprintf(stdout, "tinyacc: wrote %s beside it (Hugging Face LlamaConfig)\n", filepath.Join(filepath.Dir(*to), "config.json"))
		}
	}
	return nil
}

// cmdCkpt is `tinyacc ckpt inspect CHECKPOINT`.
func cmdCkpt(args []string, stdout io.Writer) error {
	if len(args) != 2 || args[0] != "inspect" {
		return errors.New("usage: tinyacc ckpt inspect CHECKPOINT")
	}
	dir, err := ckpt.Resolve(args[1])
	if err != nil {
		return err
	}
	ix, err := ckpt.ReadIndex(dir)
	if err != nil {
		return err
	}
	st := ix.Trainer
	fmt.Fprintf(stdout, "checkpoint %s\nstep %d; global batch %d; layout", dir, ix.Step, st.GlobalBatch)
	keys := make([]string, 0, len(st.Layout))
	for k := range st.Layout {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(stdout, " %s=%d", k, st.Layout[k])
	}
	fmt.Fprintln(stdout)
	if ix.LoRABase != "" {
		fmt.Fprintf(stdout, "LoRA adapters of the base with SHA-256 %s (export with --lora or --merge-lora)\n", ix.LoRABase)
	}
	names := make([]string, 0, len(ix.Tensors))
	for n := range ix.Tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(stdout, "%-28s %-12s %-8s %6s  %s\n", "tensor", "shape", "dtype", "pieces", "optimizer state")
	for _, n := range names {
		ti := ix.Tensors[n]
		var kinds []string
		for k := range ti.State {
			kinds = append(kinds, fmt.Sprintf("%s (%d)", k, len(ti.State[k])))
		}
		sort.Strings(kinds)
		shape := strings.Trim(strings.ReplaceAll(fmt.Sprint(ti.Shape), " ", "x"), "[]")
		fmt.Fprintf(stdout, "%-28s %-12s %-8s %6d  %s, step %d\n", n, shape, ti.DType, len(ti.Parts), strings.Join(kinds, ", "), ti.Steps)
	}
	var bytes int64
	for _, f := range ix.Files {
		bytes += f.Bytes
	}
	fmt.Fprintf(stdout, "%d files, %d bytes; ", len(ix.Files), bytes)
	if err := ix.Verify(dir); err != nil {
		fmt.Fprintln(stdout, "digests: FAILED")
		return err
	}
	fmt.Fprintln(stdout, "digests: all verified")
	return nil
}
