package config

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	trainKeys = "batch_size, beta1, beta2, dtype, eps, eval_batches, eval_every, grad_accum, grad_clip, " +
		"log_every, loss_scale, loss_scale_window, lr, min_lr, mixed_precision, momentum, nonfinite, nonfinite_max_skips, optimizer, peak_flops, schedule, seed, steps, threads, " +
		"warmup_steps, weight_decay"
	topKeys = "checkpoint, comm, cp, data, ddp, device, ep, init_from, lora, memory, metrics_file, model, parallel, plugins, pp, recompute, resume, resume_allow_nonfinite, save_to, tp, trace, trace_per_rank, train, zero"
	// noSuggestion ends the message about a TINYACC_ variable close to no name.
	noSuggestion = "; TINYACC_ variables are config keys (TINYACC_TRAIN__LR sets train.lr) or one of TINYACC_SHM, TINYACC_DEBUG, TINYACC_LIB, TINYACC_TOKEN, TINYACC_JOB_TOKEN, TINYACC_LOCAL_RANK, TINYACC_RESTART, TINYACC_PLUGIN, TINYACC_PLUGIN_BUILTIN, TINYACC_GO, TINYACC_README_STEPS, TINYACC_README_TEST, TINYACC_BF16_KERNEL, TINYACC_HOST_ID"
)

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
	return path
}

// Each layer is added in turn for the same key; the newest layer must win and
// be named as the source, while keys set only lower down keep their layer.
func TestPrecedence(t *testing.T) {
	file := writeFile(t, "run.yaml", "train:\n  lr: 0.001\n  steps: 10\n  batch_size: 2\nmodel:\n  n_layer: 3\n")
	env := []string{"TINYACC_TRAIN__LR=0.002", "TINYACC_TRAIN__STEPS=20"}
	args := []string{"--train.lr=0.003"}

	cases := []struct {
		name               string
		file               string
		env, args          []string
		lr                 float64
		lrSource           string
		steps              int
		stepsSource        string
		batchSource        string
		layerSource        string
		untouchedFromFirst string
	}{
		{"defaults", "", nil, nil, 3e-4, "default", 300, "default", "default", "default", "default"},
		{"file", file, nil, nil, 0.001, "file " + file, 10, "file " + file, "file " + file, "file " + file, "default"},
		{"env", file, env, nil, 0.002, "env TINYACC_TRAIN__LR", 20, "env TINYACC_TRAIN__STEPS", "file " + file, "file " + file, "default"},
		{"flag", file, env, args, 0.003, "flag --train.lr", 20, "env TINYACC_TRAIN__STEPS", "file " + file, "file " + file, "default"},
		{"flag without file", "", env, args, 0.003, "flag --train.lr", 20, "env TINYACC_TRAIN__STEPS", "default", "default", "default"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := Load(c.file, c.env, c.args)
			require.NoError(t, err)
			src := r.Sources()
			assert.Equal(t, c.lr, r.Config.Train.LR)
			assert.Equal(t, c.lrSource, src["train.lr"])
			assert.Equal(t, c.steps, r.Config.Train.Steps)
			assert.Equal(t, c.stepsSource, src["train.steps"])
			assert.Equal(t, c.batchSource, src["train.batch_size"])
			assert.Equal(t, c.layerSource, src["model.n_layer"])
			assert.Equal(t, c.untouchedFromFirst, src["model.n_head"])
			assert.Len(t, src, len(Keys()))
		})
	}
}

func TestYAMLFileWithNestedSections(t *testing.T) {
	file := writeFile(t, "run.yaml", `
# a full-ish run
model:
  n_layer: 2
  n_head: 2
  n_embd: 64
train:
  lr: 1e-3
  schedule: constant
  optimizer: sgd
  seed: 7
data:
  path: /tmp/corpus.txt
  order: random
  max_bytes: 1024
device: cpu
save_to: out.safetensors
metrics_file:          # null: keep the default
`)
	r, err := Load(file, nil, nil)
	require.NoError(t, err)
	c := r.Config
	assert.Equal(t, 2, c.Model.NLayer)
	assert.Equal(t, 2, c.Model.NHead)
	assert.Equal(t, 64, c.Model.NEmbd)
	assert.Equal(t, 1e-3, c.Train.LR)
	assert.Equal(t, "constant", c.Train.Schedule)
	assert.Equal(t, "sgd", c.Train.Optimizer)
	assert.Equal(t, int64(7), c.Train.Seed)
	assert.Equal(t, "/tmp/corpus.txt", c.Data.Path)
	assert.Equal(t, "random", c.Data.Order)
	assert.Equal(t, int64(1024), c.Data.MaxBytes)
	assert.Equal(t, "out.safetensors", c.SaveTo)
	assert.Equal(t, "", c.MetricsFile)
	assert.Equal(t, "default", r.Sources()["metrics_file"])
	assert.Equal(t, "file "+file, r.Sources()["data.order"])
	assert.Equal(t, 128, c.Model.BlockSize, "keys absent from the file keep their defaults")
}

func TestDottedKeysInYAMLEqualNested(t *testing.T) {
	file := writeFile(t, "flat.yaml", "train.lr: 0.005\nmodel.n_layer: 6\n")
	r, err := Load(file, nil, nil)
	require.NoError(t, err)
	assert.Equal(t, 0.005, r.Config.Train.LR)
	assert.Equal(t, 6, r.Config.Model.NLayer)
}

func TestMissingAndBrokenFiles(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	_, err := Load(missing, nil, nil)
	require.Error(t, err)
	assert.True(t, strings.HasPrefix(err.Error(), `config: reading config file "`+missing+`": open `+missing), err.Error())

	broken := writeFile(t, "broken.yaml", "model: [1, 2\n")
	_, err = Load(broken, nil, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `config: reading config file "`+broken+`": yaml:`)
}

func TestUnknownKeyInEachLayer(t *testing.T) {
	file := writeFile(t, "run.yaml", "train:\n  lrr: 1\n")
	cases := []struct {
		name      string
		file      string
		env, args []string
		want      string
	}{
		{"file", file, nil, nil,
			`config: unknown key "train.lrr" (from file ` + file + `); known keys in "train": ` + trainKeys},
		{"env", "", []string{"TINYACC_TRAIN__LRR=1"}, nil,
			`config: unknown key "train.lrr" (from env TINYACC_TRAIN__LRR); known keys in "train": ` + trainKeys + "; did you mean TINYACC_TRAIN__LR?"},
		{"flag", "", nil, []string{"--train.lrr=1"},
			`config: unknown key "train.lrr" (from flag --train.lrr); known keys in "train": ` + trainKeys},
		{"flag with separate value", "", nil, []string{"--train.lrr", "1"},
			`config: unknown key "train.lrr" (from flag --train.lrr); known keys in "train": ` + trainKeys},
		{"unknown section", "", nil, []string{"--trian.lr=1"},
			`config: unknown key "trian.lr" (from flag --trian.lr); known top-level keys: ` + topKeys},
		{"unknown top-level env", "", []string{"TINYACC_FOO=1"}, nil,
			`config: unknown key "foo" (from env TINYACC_FOO); known top-level keys: ` + topKeys + noSuggestion},
		{"single underscore env", "", []string{"TINYACC_TRAIN_LR=1"}, nil,
			`config: unknown key "train_lr" (from env TINYACC_TRAIN_LR); known top-level keys: ` + topKeys + "; did you mean TINYACC_TRAIN__LR?"},
		{"one underscore for a section (comm.timeout)", "", []string{"TINYACC_COMM_TIMEOUT=30s"}, nil,
			`config: unknown key "comm_timeout" (from env TINYACC_COMM_TIMEOUT); known top-level keys: ` + topKeys + "; did you mean TINYACC_COMM__TIMEOUT?"},
		{"misspelt reserved variable", "", []string{"TINYACC_SHMM=0"}, nil,
			`config: unknown key "shmm" (from env TINYACC_SHMM); known top-level keys: ` + topKeys + "; did you mean TINYACC_SHM?"},
		{"value below a leaf", "", nil, []string{"--train.lr.x=1"},
			`config: unknown key "train.lr.x" (from flag --train.lr.x); known keys in "train": ` + trainKeys},
		{"section as value", "", []string{"TINYACC_MODEL=3"}, nil,
			`config: key "model" (from env TINYACC_MODEL) is a section, not a value (got "3"); set its keys instead: arch, block_size, intermediate_size, moe, n_embd, n_head, n_kv_head, n_layer, norm_eps, rope_theta, tie_embeddings, vocab_size`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := Load(c.file, c.env, c.args)
			assert.Nil(t, r)
			require.Error(t, err)
			assert.Equal(t, c.want, err.Error())
		})
	}
}

func TestTypeErrors(t *testing.T) {
	fracFile := writeFile(t, "a.yaml", "train:\n  steps: 1.5\n")
	listFile := writeFile(t, "b.yaml", "train:\n  lr: [1, 2]\n")
	cases := []struct {
		name      string
		file      string
		env, args []string
		want      string
	}{
		{"float for int in file", fracFile, nil, nil,
			`config: train.steps=1.5 (from file ` + fracFile + `) is not an integer: use a value such as 300`},
		{"list in file", listFile, nil, nil,
			`config: train.lr=[1 2] (from file ` + listFile + `) is not a number: use a value such as 0.0003`},
		{"int env", "", []string{"TINYACC_MODEL__N_LAYER=two"}, nil,
			`config: model.n_layer="two" (from env TINYACC_MODEL__N_LAYER) is not an integer: use a value such as 4`},
		{"float flag", "", nil, []string{"--train.lr", "fast"},
			`config: train.lr="fast" (from flag --train.lr) is not a number: use a value such as 0.0003`},
		{"bool for int64 flag", "", nil, []string{"--train.seed=true"},
			`config: train.seed="true" (from flag --train.seed) is not an integer: use a value such as 1337`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Load(c.file, c.env, c.args)
			require.Error(t, err)
			assert.Equal(t, c.want, err.Error())
		})
	}

	file := writeFile(t, "run.yaml", "train:\n  steps: 1.5\ndata:\n  path: 12\n")
	_, err := Load(file, nil, nil)
	require.Error(t, err)
	assert.Equal(t,
		`config: data.path=12 (from file `+file+`) is not a string: quote it in YAML`+"\n"+
			`config: train.steps=1.5 (from file `+file+`) is not an integer: use a value such as 300`,
		err.Error(), "every bad value of a file is reported, sorted by key")
}

func TestEveryLayerErrorReportedTogether(t *testing.T) {
	file := writeFile(t, "run.yaml", "model:\n  n_layr: 1\n")
	_, err := Load(file,
		[]string{"TINYACC_TRAIN__STEPS=x", "TINYACC_BOGUS=1"},
		[]string{"--model.n_head", "--device=cpu", "stray"})
	require.Error(t, err)
	assert.Equal(t, []string{
		`config: unknown key "model.n_layr" (from file ` + file + `); known keys in "model": arch, block_size, intermediate_size, moe, n_embd, n_head, n_kv_head, n_layer, norm_eps, rope_theta, tie_embeddings, vocab_size`,
		`config: unknown key "bogus" (from env TINYACC_BOGUS); known top-level keys: ` + topKeys + noSuggestion,
		`config: train.steps="x" (from env TINYACC_TRAIN__STEPS) is not an integer: use a value such as 300`,
		`config: flag --model.n_head needs a value: write --model.n_head=VALUE`,
		`config: unexpected argument "stray": config flags look like --key=value (e.g. --train.lr=1e-3)`,
	}, strings.Split(err.Error(), "\n"))
}

func TestReservedEnvSkipped(t *testing.T) {
	env := []string{"PATH=/usr/bin", "HOME=/root", "tinyacc_train__lr=5"}
	for _, name := range []string{"TINYACC_DEBUG", "TINYACC_LIB", "TINYACC_TOKEN", "TINYACC_JOB_TOKEN", "TINYACC_LOCAL_RANK", "TINYACC_RESTART", "TINYACC_SHM", "TINYACC_PLUGIN", "TINYACC_PLUGIN_BUILTIN", "TINYACC_GO", "TINYACC_README_STEPS", "TINYACC_README_TEST", "TINYACC_HOST_ID", "TINYACC_BF16_KERNEL"} {
		value := map[string]string{"TINYACC_DEBUG": "detail", "TINYACC_SHM": "0", "TINYACC_README_STEPS": "1000", "TINYACC_BF16_KERNEL": "off"}[name] // their own checks: reserved_test.go, readme_test.go
		if value == "" {
			value = "not a config value"
		}
		env = append(env, name+"="+value)
	}
	assert.ElementsMatch(t, []string{"TINYACC_DEBUG", "TINYACC_LIB", "TINYACC_TOKEN", "TINYACC_JOB_TOKEN", "TINYACC_LOCAL_RANK", "TINYACC_RESTART", "TINYACC_SHM", "TINYACC_PLUGIN", "TINYACC_PLUGIN_BUILTIN", "TINYACC_GO", "TINYACC_README_STEPS", "TINYACC_README_TEST", "TINYACC_HOST_ID", "TINYACC_BF16_KERNEL"}, ReservedEnv)
	r, err := Load("", env, nil)
	require.NoError(t, err)
	for key, src := range r.Sources() {
		assert.Equal(t, "default", src, key)
	}
	assert.Equal(t, Defaults(), r.Config)
}

func TestEnvNamesAreCaseInsensitiveButUnique(t *testing.T) {
	r, err := Load("", []string{"TINYACC_train__lr=0.01", "TINYACC_DEVICE=cpu"}, nil)
	require.NoError(t, err)
	assert.Equal(t, 0.01, r.Config.Train.LR)
	assert.Equal(t, "env TINYACC_train__lr", r.Sources()["train.lr"])
	assert.Equal(t, "env TINYACC_DEVICE", r.Sources()["device"])

	_, err = Load("", []string{"TINYACC_TRAIN__LR=0.01", "TINYACC_train__lr=0.02"}, nil)
	require.Error(t, err)
	assert.Equal(t, `config: both TINYACC_TRAIN__LR and TINYACC_train__lr set "train.lr": unset one of them`, err.Error())
}

func TestFlagForms(t *testing.T) {
	r, err := Load("", nil, []string{
		"--model.n_layer=2", "--model.n_head", "2", "--model.n_embd", "64",
		"--train.lr=1e-3", "--train.lr=2e-3", // the last repeat wins
		"--data.path=a=b.txt", // only the first '=' separates
		"--train.min_lr", "-0", "--init_from=",
	})
	require.NoError(t, err)
	c := r.Config
	assert.Equal(t, 2, c.Model.NLayer)
	assert.Equal(t, 2, c.Model.NHead)
	assert.Equal(t, 64, c.Model.NEmbd)
	assert.Equal(t, 2e-3, c.Train.LR)
	assert.Equal(t, "a=b.txt", c.Data.Path)
	assert.Equal(t, 0.0, c.Train.MinLR)
	assert.Equal(t, "", c.InitFrom)
	assert.Equal(t, "flag --model.n_head", r.Sources()["model.n_head"])
	assert.Equal(t, "flag --init_from", r.Sources()["init_from"])
}

func TestShowNamesEverySource(t *testing.T) {
	file := writeFile(t, "run.yaml", "model:\n  n_layer: 2\n")
	r, err := Load(file, []string{"TINYACC_TRAIN__STEPS=5"}, []string{"--train.lr", "0.01"})
	require.NoError(t, err)
	var buf bytes.Buffer
	require.NoError(t, r.Show(&buf))
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	require.Len(t, lines, len(Keys())+1)

	rows := map[string][]string{}
	for _, line := range lines {
		f := strings.Fields(line)
		rows[f[0]] = f[1:]
	}
	assert.Equal(t, []string{"VALUE", "SOURCE"}, rows["KEY"])
	assert.Equal(t, []string{"2", "file", file}, rows["model.n_layer"])
	assert.Equal(t, []string{"5", "env", "TINYACC_TRAIN__STEPS"}, rows["train.steps"])
	assert.Equal(t, []string{"0.01", "flag", "--train.lr"}, rows["train.lr"])
	assert.Equal(t, []string{`"cosine"`, "default"}, rows["train.schedule"])
	assert.Equal(t, []string{`""`, "default"}, rows["data.path"])

	// Rows are sorted by key and the value and source columns line up.
	valueCol := strings.Index(lines[0], "VALUE")
	sourceCol := strings.Index(lines[0], "SOURCE")
	var keys []string
	for _, line := range lines[1:] {
		keys = append(keys, strings.Fields(line)[0])
		assert.NotEqual(t, ' ', line[valueCol], line)
		assert.Equal(t, ' ', rune(line[valueCol-1]), line)
		assert.NotEqual(t, ' ', line[sourceCol], line)
		assert.Equal(t, ' ', rune(line[sourceCol-1]), line)
	}
	assert.Equal(t, Keys(), keys)
}

func TestFromTextJSON(t *testing.T) {
	r, err := FromText("{\n\t\"model\": {\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32},\n\t\"train\": {\"lr\": 0.01, \"seed\": 9007199254740993},\n\t\"device\": \"cpu\"\n}")
	require.NoError(t, err)
	assert.Equal(t, 2, r.Config.Model.NLayer)
	assert.Equal(t, 32, r.Config.Model.NEmbd)
	assert.Equal(t, 0.01, r.Config.Train.LR)
	assert.Equal(t, int64(9007199254740993), r.Config.Train.Seed, "JSON integers above 2^53 stay exact")
	assert.Equal(t, "text", r.Sources()["train.lr"])
	assert.Equal(t, "default", r.Sources()["train.steps"])

	_, err = FromText(`{"train": {"lr": "x"}}`)
	require.Error(t, err)
	assert.Equal(t, `config: train.lr="x" (from text) is not a number: use a value such as 0.0003`, err.Error())

	_, err = FromText(`{"train": `)
	require.Error(t, err)
	assert.Equal(t, "config: parsing config text: unexpected EOF", err.Error())

	_, err = FromText(`{"train": {}} {"model": {}}`)
	require.Error(t, err)
	assert.Equal(t, "config: parsing config text: unexpected text after the JSON object", err.Error())
}

// TestYAMLShapeAndTags: a file whose top level is not a mapping is told
// what a config looks like (no Go type names), and a tag other than the
// plain types is refused, naming it.
func TestYAMLShapeAndTags(t *testing.T) {
	const shape = "; a config is a mapping of sections to their keys, one per line, such as \"train:\" followed by \"  steps: 300\""
	const tags = " is not accepted; a config holds only strings, numbers, booleans, lists and mappings"
	for _, c := range []struct{ text, want string }{
		{"- train\n- model\n", "yaml: line 1: the top level is a list" + shape},
		{"\n42\n", `yaml: line 2: the top level is a single value ("42")` + shape},
		{"train: !!python/object:os.system\n  steps: 3\n", `yaml: line 1: tag "!!python/object:os.system"` + tags},
		{"train:\n  steps: !!python/object/apply:os.system [\"ls\"]\n", `yaml: line 2: tag "!!python/object/apply:os.system"` + tags},
		{"train:\n  steps: !custom 3\n", `yaml: line 2: tag "!custom"` + tags},
		{"data:\n  path: !!binary aGVsbG8=\n", `yaml: line 2: tag "!!binary"` + tags},
	} {
		path := writeFile(t, "c.yaml", c.text)
		_, err := Load(path, nil, nil)
		require.EqualError(t, err, `config: reading config file "`+path+`": `+c.want, c.text)
	}
	r, err := FromText("train:\n  steps: !!int 5\n  lr: !!float 1e-3\n")
	require.NoError(t, err)
	assert.Equal(t, 5, r.Config.Train.Steps)
	assert.Equal(t, 1e-3, r.Config.Train.LR)
}

func TestFromTextYAML(t *testing.T) {
	r, err := FromText("train:\n  steps: 12\n  schedule: constant\n")
	require.NoError(t, err)
	assert.Equal(t, 12, r.Config.Train.Steps)
	assert.Equal(t, "constant", r.Config.Train.Schedule)

	r, err = FromText("")
	require.NoError(t, err)
	assert.Equal(t, Defaults(), r.Config)

	_, err = FromText("train:\n  steps: 0\n")
	require.Error(t, err)
	assert.Equal(t, "config: train.steps=0 must be positive: set it to 1 or more", err.Error())
}

func TestFromMap(t *testing.T) {
	c, err := FromMap(map[string]any{
		"train.lr":    0.05,
		"model":       map[string]any{"n_layer": 1},
		"data.order":  "random",
		"train.steps": "7",
	})
	require.NoError(t, err)
	want := Defaults()
	want.Train.LR = 0.05
	want.Model.NLayer = 1
	want.Data.Order = "random"
	want.Train.Steps = 7
	assert.Equal(t, want, *c)

	c, err = FromMap(nil)
	require.NoError(t, err)
	assert.Equal(t, Defaults(), *c)

	_, err = FromMap(map[string]any{"train.lrr": 1})
	require.Error(t, err)
	assert.Equal(t, `config: unknown key "train.lrr" (from map); known keys in "train": `+trainKeys, err.Error())

	_, err = FromMap(map[string]any{"model.n_head": 3})
	require.Error(t, err)
	assert.Equal(t, "config: model.n_embd=128 is not divisible by model.n_head=3: choose n_embd a multiple of n_head", err.Error())
}

func TestLoadValidates(t *testing.T) {
	_, err := Load("", []string{"TINYACC_DEVICE=cuda"}, []string{"--train.lr=0"})
	require.Error(t, err)
	assert.Equal(t,
		"config: train.lr=0 must be > 0: use a learning rate such as 3e-4\n"+
			`config: device="cuda": this build has no GPU backend yet; use device=cpu`,
		err.Error())
}
