package config

import (
	"strings"
	"testing"
)

// FuzzFromText feeds arbitrary text to the config loader: it must never
// panic, every error must stay short enough to read, and whatever it
// accepts must be a valid config.
func FuzzFromText(f *testing.F) {
	f.Add("train:\n  lr: 1e-3\n  steps: 10\n")
	f.Add("model: {n_layer: 2, n_embd: 64}\nzero: {stage: 3}\n")
	f.Add(`{"train": {"lr": 0.001, "seed": 9007199254740993}}`)
	f.Add("a: &a [1, 2]\nb: [*a, *a]\n")
	f.Add(strings.Repeat("?\n", 50))
	f.Add("train:\n  lr: [unclosed\n")
	f.Add("comm:\n  timeout: 90s\ndata:\n  path: ''\n")
	f.Fuzz(func(t *testing.T, text string) {
		r, err := FromText(text)
		if err != nil {
			if r != nil {
				t.Fatalf("error %v with a result", err)
			}
			if n := len(err.Error()); n > 2048 {
				t.Fatalf("error of %d bytes for %d bytes of text", n, len(text))
			}
			return
		}
		if err := r.Config.Validate(); err != nil {
			t.Fatalf("accepted an invalid config: %v", err)
		}
	})
}
