package launch

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseStat(t *testing.T) {
	state, pgrp, ok := parseStat([]byte("4242 (we ird) (x) S 17 4240 4240 0 -1 4194560"))
	require.True(t, ok)
	assert.Equal(t, byte('S'), state)
	assert.Equal(t, 4240, pgrp)
	_, _, ok = parseStat([]byte("garbage"))
	assert.False(t, ok)
}
