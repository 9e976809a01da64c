package config

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestReservedEnvValuesChecked(t *testing.T) {
	for _, ok := range []string{"TINYACC_SHM=0", "TINYACC_SHM=1", "TINYACC_SHM=true", "TINYACC_SHM=false", "TINYACC_SHM=",
		"TINYACC_DEBUG=detail", "TINYACC_DEBUG=off", "TINYACC_DEBUG=0", "TINYACC_BF16_KERNEL=off", "TINYACC_BF16_KERNEL=on"} {
		_, err := Load("", []string{ok}, nil)
		require.NoError(t, err, ok)
	}
	_, err := Load("", []string{"TINYACC_SHM=maybe", "TINYACC_DEBUG=yes", "TINYACC_BF16_KERNEL=0"}, nil)
	require.EqualError(t, err, `config: TINYACC_SHM="maybe" is not one of "0", "1", "true", "false" (or unset)`+"\n"+
		`config: TINYACC_DEBUG="yes" is not one of "0", "off", "detail" (or unset)`+"\n"+
		`config: TINYACC_BF16_KERNEL="0" is not one of "on", "off" (or unset)`)
}

// TestReservedTableIsDocumented: the README's table of variables that are
// not config keys is this package's table.
func TestReservedTableIsDocumented(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	for _, r := range Reserved {
		require.Contains(t, string(readme), "`"+r.Name+"`", "README's table of TINYACC_ variables")
	}
}
