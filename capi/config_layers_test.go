package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/config"
)

// shownValues is `tinyacc config show`'s KEY → VALUE columns for a config
// whose every value is read back from JSON (as a binding hands it over):
// the values in the command line's own spelling, without their sources.
func shownValues(t *testing.T, r *config.Resolved) map[string]string {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, r.Show(&b))
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n")[1:] {
		f := strings.Fields(line)
		require.GreaterOrEqual(t, len(f), 2, line)
		out[f[0]] = f[1]
	}
	return out
}

// viaJSON resolves the JSON a config handle renders as a config file with
// no environment, so that it prints in config show's spelling.
func viaJSON(t *testing.T, h int64) map[string]string {
	t.Helper()
	js, err := apiConfigJSON(h)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "resolved.json")
	require.NoError(t, os.WriteFile(path, []byte(js), 0o644))
	r, err := config.Load(path, nil, nil)
	require.NoError(t, err)
	return shownValues(t, r)
}

// TestConfigLayersMatchTheCLI: the C ABI resolves the same file (or the
// same text), environment and flags to the config `tinyacc config show`
// prints for them: defaults < file or text < TINYACC_* < flags.
func TestConfigLayersMatchTheCLI(t *testing.T) {
	yaml := "model: {n_layer: 3, n_embd: 48, n_head: 4}\ntrain: {lr: 0.01, steps: 7, batch_size: 2}\ncomm: {timeout: 90s}\n"
	file := filepath.Join(t.TempDir(), "run.yaml")
	require.NoError(t, os.WriteFile(file, []byte(yaml), 0o644))
	t.Setenv("TINYACC_TRAIN__LR", "0.002")  // over the file
	t.Setenv("TINYACC_TRAIN__STEPS", "9")   // under the flag
	t.Setenv("TINYACC_COMM__TIMEOUT", "2s") // over the file
	flags := []string{"--train.steps=11", "--model.n_layer=2"}

	cli, err := config.Load(file, os.Environ(), flags)
	require.NoError(t, err)
	want := shownValues(t, cli)
	require.Equal(t, map[string]string{"model.n_layer": "2", "model.n_embd": "48", "train.lr": "0.002", "train.steps": "11", "comm.timeout": "2s"},
		map[string]string{"model.n_layer": want["model.n_layer"], "model.n_embd": want["model.n_embd"], "train.lr": want["train.lr"],
			"train.steps": want["train.steps"], "comm.timeout": want["comm.timeout"]})

	h, err := apiConfigResolve(file, "", strings.Join(flags, "\n"))
	require.NoError(t, err)
	require.Equal(t, want, viaJSON(t, h), "file + env + flags")

	h, err = apiConfigResolve("", yaml, "\n"+strings.Join(flags, "\n")+"\n")
	require.NoError(t, err)
	require.Equal(t, want, viaJSON(t, h), "text + env + flags")

	// tinyacc_config_new is text < env, as `config show --config` without flags.
	cli, err = config.Load(file, os.Environ(), nil)
	require.NoError(t, err)
	h, err = apiConfigNew(yaml)
	require.NoError(t, err)
	require.Equal(t, shownValues(t, cli), viaJSON(t, h), "tinyacc_config_new")
	h, err = apiConfigFromEnv(file)
	require.NoError(t, err)
	require.Equal(t, shownValues(t, cli), viaJSON(t, h), "tinyacc_config_from_env")

	_, err = apiConfigResolve(file, yaml, "")
	require.EqualError(t, err, "config: give a file or text, not both")
}

// TestConfigUnknownVariable: a TINYACC_ variable that is no key is an error
// of every entry point, naming it and the nearest variable.
func TestConfigUnknownVariable(t *testing.T) {
	t.Setenv("TINYACC_COMM_TIMEOUT", "2s")
	want := `config: unknown key "comm_timeout" (from env TINYACC_COMM_TIMEOUT)`
	for name, f := range map[string]func() (int64, error){
		"new":      func() (int64, error) { return apiConfigNew("") },
		"from_env": func() (int64, error) { return apiConfigFromEnv("") },
		"resolve":  func() (int64, error) { return apiConfigResolve("", "{}", "") },
	} {
		_, err := f()
		require.Error(t, err, name)
		require.Contains(t, err.Error(), want, name)
		require.True(t, strings.HasSuffix(err.Error(), "did you mean TINYACC_COMM__TIMEOUT?"), "%s: %v", name, err)
	}
	_, err := worldOptions()
	require.ErrorContains(t, err, "did you mean TINYACC_COMM__TIMEOUT?")
}

// The world group takes comm.timeout from the environment.
func TestWorldOptionsTimeout(t *testing.T) {
	t.Setenv("TINYACC_COMM__TIMEOUT", "3s")
	o, err := worldOptions()
	require.NoError(t, err)
	require.Equal(t, "3s", o.Timeout.String())
}
