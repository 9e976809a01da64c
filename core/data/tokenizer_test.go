package data

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEncodeIsByteValues(t *testing.T) {
	assert.Equal(t, []int32{104, 105, 0xC3, 0xA9}, Encode("hi\u00e9"))
	assert.Equal(t, []int32{}, Encode(""))
	assert.Equal(t, []int32{0, 255}, EncodeBytes([]byte{0, 255}))
}

func TestTokenizerRoundTrip(t *testing.T) {
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	for _, s := range []string{"", "package main\n", "h\u00e9llo, \u4e16\u754c \U0001F600", string(all), "\xff\xfe invalid utf8"} {
		toks := Encode(s)
		require.Len(t, toks, len(s))
		for _, tok := range toks {
			require.True(t, tok >= 0 && tok < VocabSize)
		}
		assert.Equal(t, s, Decode(toks))
	}
}

func TestDecodeOutOfRangeIsReplacementChar(t *testing.T) {
	assert.Equal(t, "a\uFFFDb\uFFFD", Decode([]int32{97, 256, 98, -1}))
	assert.Equal(t, "\uFFFD", Decode([]int32{50256}))
}
