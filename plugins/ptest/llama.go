package ptest

import "github.com/tinyacc/tinyacc/core/config"

// Llama64 is the Llama of the float64 matrix: Config64's shape (4 layers,
// 64 wide, 4 heads) with 2 key/value heads, a SwiGLU width of 96, an odd
// vocabulary and its own lm_head.
func Llama64() config.Config {
	c := Config64()
	c.Model.Arch, c.Model.NKVHead, c.Model.IntermediateSize, c.Model.VocabSize = "llama", 2, 96, 259
	return c
}
