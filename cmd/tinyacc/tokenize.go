package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/tinyacc/tinyacc/core/data"
)

// cmdTokenize writes a token shard (llm.c's layout) from a text file with
// the byte tokenizer, so the shard path can be tried end to end without a
// download: training on the shard gives the losses of training on the
// text.
func cmdTokenize(args []string, stdout io.Writer) error {
	var in, out string
	for i := 0; i < len(args); i++ {
		a := args[i]
		var dst *string
		switch {
		case a == "--in" || a == "--out":
			if i+1 >= len(args) {
				return fmt.Errorf("tokenize: %s needs a file name", a)
			}
			dst = map[string]*string{"--in": &in, "--out": &out}[a]
			i++
			*dst = args[i]
		case strings.HasPrefix(a, "--in="):
			in = strings.TrimPrefix(a, "--in=")
		case strings.HasPrefix(a, "--out="):
			out = strings.TrimPrefix(a, "--out=")
		default:
			return fmt.Errorf("tokenize: unexpected argument %q; usage: tinyacc tokenize --in FILE --out FILE.bin", a)
		}
	}
	if in == "" || out == "" {
		return errors.New("tokenize: usage: tinyacc tokenize --in FILE --out FILE.bin")
	}
	text, err := os.ReadFile(in)
	if err != nil {
		return fmt.Errorf("tokenize: %w", err)
	}
	toks := data.EncodeBytes(text)
	if err := data.WriteShard(out, toks); err != nil {
		return fmt.Errorf("tokenize: %w", err)
	}
	fmt.Fprintf(stdout, "tinyacc: wrote %d tokens (byte tokenizer, uint16) from %s to %s\n", len(toks), in, out)
	return nil
}
