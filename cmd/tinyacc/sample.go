package main

import (
	"flag"
	"fmt"
	"io"

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
	_, meta, err := ckpt.Load(*from)
	if err != nil {
		return err
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
	fmt.Fprintln(stdout, data.Decode(out))
	return nil
}
