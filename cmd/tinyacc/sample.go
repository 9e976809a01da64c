package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"unicode"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/data"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/trainer"
)

func cmdSample(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("sample", flag.ContinueOnError)
	from := fs.String("from", "", "safetensors weights written by `tinyacc train --save_to=FILE`")
	prompt := fs.String("prompt", "func main", "text to continue")
	n := fs.Int("tokens", 200, "tokens to generate")
	temp := fs.Float64("temperature", 0.8, "softmax temperature (0 = greedy)")
	topK := fs.Int("top_k", 0, "sample among the k most likely tokens (0 = all)")
	seed := fs.Int64("seed", 1, "sampling seed")
	var mc nn.GPTConfig
	fs.IntVar(&mc.NLayer, "model.n_layer", 0, "model shape, for files without tinyacc metadata")
	fs.IntVar(&mc.NHead, "model.n_head", 0, "")
	fs.IntVar(&mc.NEmbd, "model.n_embd", 0, "")
	fs.IntVar(&mc.BlockSize, "model.block_size", 0, "")
	fs.IntVar(&mc.VocabSize, "model.vocab_size", 0, "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *from == "" {
		return fmt.Errorf("sample: --from FILE.safetensors is required (write one with tinyacc train --save_to=FILE)")
	}
	if err := trainer.CheckSampling(*n, *temp, *topK); err != nil {
		return fmt.Errorf("sample: --%v", err)
	}
	if st, err := os.Stat(*from); err == nil && st.IsDir() {
		return sampleFromDir(*from)
	}
	// The header alone gives the model shape; LoadWeights then reads
	// each tensor straight into its parameter.
	_, meta, err := ckpt.Inspect(*from)
	if err != nil {
		return err
	}
	if _, ok := meta[trainer.MetaLoRABase]; ok {
		return fmt.Errorf("sample: %s holds LoRA adapters, not a model (save_to of a run with lora.rank > 0): sample from its base with the adapters merged in (tinyacc export --merge-lora --from CHECKPOINT --to FILE)", *from)
	}
	if mc.NLayer == 0 {
		var ok bool
		mc, ok = trainer.ModelConfigFromMetadata(meta)
		if !ok {
			return fmt.Errorf("sample: %s has no tinyacc model metadata; give --model.n_layer, --model.n_head, --model.n_embd, --model.block_size and --model.vocab_size", *from)
		}
	}
	m, err := nn.NewGPT(mc, 0, tensor.Float32, nil)
	if err != nil {
		return err
	}
	if err := trainer.LoadWeights(m, *from); err != nil {
		return err
	}
	out, err := trainer.Generate(m, data.Encode(*prompt), *n, *temp, *topK, *seed)
	if err != nil {
		return err
	}
	text := data.Decode(out)
	if isTerminal(stdout) {
		text = escapeControls(text)
	}
	fmt.Fprintln(stdout, text)
	return nil
}

// sampleFromDir is the error for --from a directory: a checkpoint is
// exported to one weights file first, and the error says how.
func sampleFromDir(dir string) error {
	if _, err := ckpt.Resolve(dir); err == nil {
		return fmt.Errorf("sample: --from %s is a checkpoint directory; sample reads one weights file: "+
			"tinyacc export --from %s --to model.safetensors, then tinyacc sample --from model.safetensors", dir, dir)
	}
	return fmt.Errorf("sample: --from %s is a directory; give the file tinyacc train --save_to=FILE or tinyacc export --to FILE wrote", dir)
}

// escapeControls writes the control characters a model may generate
// (escape sequences, carriage returns, bells) as Go escapes, so that
// sampled text printed to a terminal cannot move the cursor, clear the
// screen or retitle the window. Newlines and tabs stay: they are text.
func escapeControls(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r != '\n' && r != '\t' && unicode.IsControl(r) {
			q := strconv.QuoteRune(r) // '\x1b', '\r', '\u0085'
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}
