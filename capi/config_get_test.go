package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestConfigGet: one key of a config as text (strings unquoted), an
// integer key as a number, and the errors for an unknown key and a key
// that is not an integer.
func TestConfigGet(t *testing.T) {
	h, err := apiConfigNew("train: {steps: 42, lr: 0.001}\ncomm: {timeout: 90s}\n")
	require.NoError(t, err)
	defer freeHandle(h)
	for key, want := range map[string]string{"train.steps": "42", "train.lr": "0.001", "train.schedule": "cosine", "comm.timeout": "1m30s"} {
		v, err := apiConfigGet(h, key)
		require.NoError(t, err)
		require.Equal(t, want, v, key)
	}
	n, err := apiConfigGetInt(h, "train.steps")
	require.NoError(t, err)
	require.Equal(t, int64(42), n)

	_, err = apiConfigGet(h, "train.stepz")
	require.Equal(t, errConfig, codeOf(err))
	require.EqualError(t, err, `config: unknown key "train.stepz" ('tinyacc config show' lists every key)`)
	_, err = apiConfigGetInt(h, "train.schedule")
	require.Equal(t, errConfig, codeOf(err))
	require.EqualError(t, err, `config: train.schedule is "cosine", not an integer; read it with tinyacc_config_get`)
}
