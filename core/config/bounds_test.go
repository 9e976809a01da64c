package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// 4000 lines of "?" (8 KB) made the YAML library report every pair of
// duplicate keys: 20 seconds and a 450 MB message. Both entry points now
// refuse it at once with a short message naming the first duplicate.
func TestPathologicalYAMLFailsShort(t *testing.T) {
	text := strings.Repeat("?\n", 4000)
	want := `yaml: line 2: mapping key "" already defined at line 1`

	_, err := FromText(text)
	require.EqualError(t, err, "config: parsing config text: "+want)

	path := filepath.Join(t.TempDir(), "q.yaml")
	require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
	_, err = Load(path, nil, nil)
	require.EqualError(t, err, `config: reading config file "`+path+`": `+want)
}

func TestConfigTextOverOneMiBRefused(t *testing.T) {
	text := "train:\n  lr: 1e-3\n" + strings.Repeat("# padding\n", MaxTextBytes/10+1)
	_, err := FromText(text)
	require.EqualError(t, err, "config: config text is 1048598 bytes, over the limit of 1048576 (1 MiB); a config needs a few KiB")

	path := filepath.Join(t.TempDir(), "big.yaml")
	require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
	_, err = Load(path, nil, nil)
	require.EqualError(t, err, `config: reading config file "`+path+`": the file is over the limit of 1048576 bytes (1 MiB); a config needs a few KiB`)
}

// Errors that list many lines are cut to their first ones.
func TestParseErrorsAreCut(t *testing.T) {
	var b strings.Builder
	for i := 0; i < 500; i++ {
		b.WriteString("train:\n  lr: [unclosed\n")
	}
	_, err := FromText(b.String())
	require.Error(t, err)
	require.Less(t, len(err.Error()), 2048)

	// A document of many type errors (one per key) is cut too.
	b.Reset()
	b.WriteString("train: [")
	for i := 0; i < 900; i++ {
		b.WriteString("{a: 1}, ")
	}
	b.WriteString("]\n")
	_, err = FromText(b.String())
	require.Error(t, err)
	require.Less(t, len(err.Error()), 2048, err.Error())
}

// Aliases that expand to millions of nodes are refused before decoding.
func TestAliasBombRefused(t *testing.T) {
	text := "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
	prev := "a"
	for _, name := range []string{"b", "c", "d", "e", "f", "g"} {
		text += name + ": &" + name + " [*" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + "]\n"
		prev = name
	}
	_, err := FromText(text)
	require.EqualError(t, err, "config: parsing config text: yaml: the document expands to more than 100000 nodes (aliases included); a config has a few dozen")
}
