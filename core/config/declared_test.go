package config

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestListValues(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.yaml")
	require.NoError(t, os.WriteFile(file, []byte("plugins:\n  process: [/a/b, ./c]\n"), 0o644))
	r, err := Load(file, nil, nil)
	require.NoError(t, err)
	require.Equal(t, []string{"/a/b", "./c"}, r.Config.Plugins.Process)

	r, err = Load(file, []string{"TINYACC_PLUGINS__PROCESS= /x , /y,"}, nil)
	require.NoError(t, err)
	require.Equal(t, []string{"/x", "/y"}, r.Config.Plugins.Process)
	require.Equal(t, "env TINYACC_PLUGINS__PROCESS", r.Sources()["plugins.process"])

	r, err = Load(file, nil, []string{"--plugins.process=/z"})
	require.NoError(t, err)
	require.Equal(t, []string{"/z"}, r.Config.Plugins.Process)
	var out bytes.Buffer
	require.NoError(t, r.Show(&out))
	require.Regexp(t, `plugins.process +\[/z\] +flag --plugins.process`, out.String())

	_, err = FromText("plugins:\n  process: [1, 2]\n")
	require.EqualError(t, err, `config: plugins.process=[1 2] (from text) is not a list of strings: use a YAML list of strings, or items separated by commas`)
}

func TestDeclaredKeys(t *testing.T) {
	declare := func(paths []string) ([]Declared, error) {
		require.Equal(t, []string{"/bin/guard"}, paths)
		return []Declared{
			{Key: "guard.max_skips", Type: "int", Default: "3", Plugin: "guard"},
			{Key: "guard.tag", Type: "string", Default: "g", Plugin: "guard"},
		}, nil
	}
	r, err := LoadWith("", []string{"TINYACC_GUARD__MAX_SKIPS=7"}, []string{"--plugins.process=/bin/guard", "--guard.tag=x y"}, declare)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"guard.max_skips": "7", "guard.tag": "x y"}, r.Config.Declared)
	var out bytes.Buffer
	require.NoError(t, r.Show(&out))
	require.Regexp(t, `guard.max_skips +7 +env TINYACC_GUARD__MAX_SKIPS\n`, out.String())
	require.Regexp(t, `guard.tag +x y +flag --guard.tag\n`, out.String())
	require.Less(t, strings.Index(out.String(), "guard.tag"), strings.Index(out.String(), "init_from"), "sorted among the built-in keys")

	r, err = LoadWith("", nil, []string{"--plugins.process=/bin/guard"}, declare)
	require.NoError(t, err)
	require.Equal(t, "3", r.Config.Declared["guard.max_skips"])
	require.Equal(t, "default (plugin guard)", r.Sources()["guard.max_skips"])

	_, err = LoadWith("", nil, []string{"--plugins.process=/bin/guard", "--guard.max_skips=many"}, declare)
	require.EqualError(t, err, `config: guard.max_skips="many" (from flag --guard.max_skips) is not an integer: use a value such as 3 (key of plugin guard)`)

	_, err = LoadWith("", nil, []string{"--plugins.process=/bin/guard", "--guard.maxskips=1"}, declare)
	require.ErrorContains(t, err, `config: unknown key "guard.maxskips" (from flag --guard.maxskips)`)

	_, err = Load("", nil, []string{"--guard.max_skips=1"})
	require.ErrorContains(t, err, `config: unknown key "guard.max_skips" (from flag --guard.max_skips)`, "without plugins nobody declares it")

	bad := func([]string) ([]Declared, error) {
		return []Declared{{Key: "train.nonfinite", Type: "bool", Default: "false", Plugin: "guard"}}, nil
	}
	_, err = LoadWith("", nil, []string{"--plugins.process=/bin/guard"}, bad)
	require.EqualError(t, err, `config: plugin guard declares key "train.nonfinite", which is not under a section of its own (use guard.NAME, outside the built-in sections)`)
}
