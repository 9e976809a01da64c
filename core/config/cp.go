package config

import "fmt"

// CPSplitParts is the number of equal chunks model.block_size must divide
// into under context parallel: cp chunks (contiguous, one per rank) or 2·cp
// (zigzag, two per rank), times tp when sequence parallel then splits each
// rank's rows over the tensor-parallel group. 1 when cp is 1.
func (c *Config) CPSplitParts() int {
	cp := c.Parallel.CP
	if cp <= 1 {
		return 1
	}
	n := cp
	if c.CP.Split == "zigzag" {
		n = 2 * cp
	}
	if c.TP.SequenceParallel && c.Parallel.TP > 1 {
		n *= c.Parallel.TP
	}
	return n
}

// validateCP checks the cp.* keys and that the sequence splits over the
// context-parallel ranks.
func (c *Config) validateCP(v *validator) {
	v.oneOf("cp.attention", c.CP.Attention, "ring", "allgather")
	v.oneOf("cp.split", c.CP.Split, "zigzag", "contiguous")
	cp, T := c.Parallel.CP, c.Model.BlockSize
	if cp <= 1 || T <= 0 || (c.CP.Split != "zigzag" && c.CP.Split != "contiguous") {
		return
	}
	n := c.CPSplitParts()
	if T%n == 0 {
		return
	}
	how := fmt.Sprintf("parallel.cp=%d", cp)
	if c.CP.Split == "zigzag" {
		how = fmt.Sprintf("2 × parallel.cp=%d (cp.split=zigzag: two chunks per rank)", cp)
	}
	if n != cp && n != 2*cp {
		how += fmt.Sprintf(" × parallel.tp=%d (tp.sequence_parallel splits a rank's rows again)", c.Parallel.TP)
	}
	if n != cp {
		how += fmt.Sprintf(" = %d", n)
	}
	v.addf("config: model.block_size=%d is not divisible by %s: context parallel cuts every sequence into equal chunks; choose block_size a multiple of %d", T, how, n)
}
