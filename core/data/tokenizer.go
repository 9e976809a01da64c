// Package data turns text into the token batches the trainer consumes: a
// byte-level tokenizer, corpus loading (a file, a directory, or the Go sources
// shipped with the toolchain), a train/validation split, and a rank-aware
// Loader whose samples are a pure function of their global index, so any
// parallel layout sees exactly the batches a single process would.
package data

import "strings"

// VocabSize is the number of distinct tokens the byte tokenizer produces. A
// model may pad its vocabulary above this (for friendlier matrix shapes); the
// extra ids never come out of Encode.
const VocabSize = 256

// Encode maps every byte of s to one token whose id is the byte value. Working
// on bytes rather than runes means any input, valid UTF-8 or not, round-trips
// through Decode unchanged.
func Encode(s string) []int32 {
	out := make([]int32, len(s))
	for i := 0; i < len(s); i++ {
		out[i] = int32(s[i])
	}
	return out
}

// EncodeBytes is Encode for a byte slice, avoiding a string copy of a large
// corpus.
func EncodeBytes(b []byte) []int32 {
	out := make([]int32, len(b))
	for i, c := range b {
		out[i] = int32(c)
	}
	return out
}

// Decode is the inverse of Encode. Ids outside [0, 256) cannot come from the
// tokenizer but a model with a padded vocabulary may sample them; they decode
// as U+FFFD so generated text stays printable instead of failing.
func Decode(tokens []int32) string {
	var b strings.Builder
	b.Grow(len(tokens))
	for _, t := range tokens {
		if t >= 0 && t < VocabSize {
			b.WriteByte(byte(t))
		} else {
			b.WriteRune('\uFFFD')
		}
	}
	return b.String()
}
