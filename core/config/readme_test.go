package config

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TINYACC_README_STEPS lowers train.steps from any layer, never raises
// it, and a value that is not a positive count is refused.
func TestReadmeStepsCaps(t *testing.T) {
	r, err := Load("", []string{"TINYACC_README_STEPS=3"}, []string{"--train.steps=100"})
	require.NoError(t, err)
	require.Equal(t, 3, r.Config.Train.Steps)
	require.Equal(t, "env TINYACC_README_STEPS", r.Sources()["train.steps"])

	r, err = Load("", []string{"TINYACC_README_STEPS=50"}, []string{"--train.steps=10"})
	require.NoError(t, err)
	require.Equal(t, 10, r.Config.Train.Steps)
	require.Equal(t, "flag --train.steps", r.Sources()["train.steps"])

	_, err = Load("", []string{"TINYACC_README_STEPS=few"}, nil)
	require.EqualError(t, err, `config: TINYACC_README_STEPS="few" is not a positive step count (or unset)`)
}
