package trainer

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/ckpt"
)

// obj walks nested JSON objects of an index by keys.
func obj(m map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		m = m[k].(map[string]any)
	}
	return m
}

// part is piece i of tensor name's value (kind "") or optimizer state.
func part(m map[string]any, name, kind string, i int) map[string]any {
	ti := obj(m, "tensors", name)
	if kind == "" {
		return ti["parts"].([]any)[i].(map[string]any)
	}
	return ti["state"].(map[string]any)[kind].([]any)[i].(map[string]any)
}

// damageState rewrites element 3 of tensor key of the optimizer file to v
// and the file's digest in the index to match.
func damageState(t *testing.T, dir, key string, v float32) {
	path := filepath.Join(dir, "optim-r00000.safetensors")
	ts, meta, err := ckpt.Load(path)
	require.NoError(t, err)
	ts[key].F32()[3] = v
	require.NoError(t, ckpt.Save(path, ts, meta))
	fi, err := ckpt.Digest(path)
	require.NoError(t, err)
	editJSON(t, dir, func(m map[string]any) {
		obj(m, "files")["optim-r00000.safetensors"] = map[string]any{"sha256": fi.SHA256, "bytes": fi.Bytes}
	})
}

func editJSON(t *testing.T, dir string, f func(m map[string]any)) {
	path := filepath.Join(dir, ckpt.IndexFile)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	f(m)
	b, err = json.Marshal(m)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, b, 0o644))
}

// TestIndexValuesAreChecked damages one value of a checkpoint's index.json
// at a time and resumes from it: each is refused before any training and
// before any weight changes, naming the field, where an unchecked value
// would panic (step -1), resume later weights as another step (step 0),
// read a file outside the checkpoint, or load a state the run's optimizer
// would misuse.
func TestIndexValuesAreChecked(t *testing.T) {
	cfg := smallConfig()
	cfg.Train.Steps, cfg.Train.EvalEvery = 6, 0
	cfg.Checkpoint.Dir, cfg.Checkpoint.Every = filepath.Join(t.TempDir(), "ckpt"), 4
	tr, err := New(cfg, Options{Train: corpus[:4000]})
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.NoError(t, err)
	good := filepath.Join(cfg.Checkpoint.Dir, ckpt.StepDir(4))

	const (
		layoutMin = "; world, dp, tp, pp, cp, batch_size and grad_accum are each 1 or more"
		nonfinite = " (set resume_allow_nonfinite to load it anyway)"
	)
	// Damage to the index alone, refused as the index is read.
	fields := []struct {
		name string
		edit func(m map[string]any)
		want string // after "resume: ckpt: DIR/index.json: "
	}{
		{"negative step", func(m map[string]any) { m["step"] = -1 }, "step is -1, but a checkpoint is written after 1 or more steps"},
		{"step 0", func(m map[string]any) { m["step"] = 0 }, "step is 0, but a checkpoint is written after 1 or more steps"},
		{"step of another directory", func(m map[string]any) { m["step"] = 5 }, "step is 5, but the checkpoint's directory is step-0000004"},
		{"trainer.step", func(m map[string]any) { obj(m, "trainer")["step"] = 3 }, "trainer.step is 3, but step is 4"},
		{"trainer.schedule_step", func(m map[string]any) { obj(m, "trainer")["schedule_step"] = 40 }, "trainer.schedule_step is 40, but step is 4"},
		{"trainer.seed", func(m map[string]any) { obj(m, "trainer")["seed"] = 7 }, "trainer.seed is 7, but config train.seed is 1337"},
		{"trainer.data_order", func(m map[string]any) { obj(m, "trainer")["data_order"] = "random" }, `trainer.data_order is "random", but config data.order is "sequential"`},
		{"trainer.data_positions value", func(m map[string]any) { obj(m, "trainer")["data_positions"] = []any{5} },
			"trainer.data_positions[0] is 5, but data-parallel rank 0 reads sample 16 next (step × global_batch + rank × batch_size)"},
		{"trainer.data_positions length", func(m map[string]any) { obj(m, "trainer")["data_positions"] = []any{16, 20} },
			"trainer.data_positions has 2 entries, but trainer.layout.dp is 1"},
		{"trainer.global_batch", func(m map[string]any) { obj(m, "trainer")["global_batch"] = 8 },
			"trainer.global_batch is 8, but trainer.layout gives batch_size 4 × grad_accum 1 × dp 1 = 4"},
		{"trainer.layout.dp", func(m map[string]any) { obj(m, "trainer", "layout")["dp"] = 0 }, "trainer.layout.dp is 0" + layoutMin},
		{"trainer.layout.world missing", func(m map[string]any) { delete(obj(m, "trainer", "layout"), "world") }, "trainer.layout.world is missing" + layoutMin},
		{"trainer.layout.tp", func(m map[string]any) { obj(m, "trainer", "layout")["tp"] = 2 },
			"trainer.layout has dp 1 × tp 2 × pp 1 × cp 1 = 2 ranks, but world is 1"},
		{"trainer.layout against config", func(m map[string]any) {
			l := obj(m, "trainer", "layout")
			l["tp"], l["world"] = 2, 2
		}, "trainer.layout.tp is 2, but config parallel.tp is 1"},
		{"trainer.layout.zero_stage", func(m map[string]any) { obj(m, "trainer", "layout")["zero_stage"] = 9 }, "trainer.layout.zero_stage is 9, not 0 to 3"},
		{"file outside the checkpoint", func(m map[string]any) {
			f := obj(m, "files")
			f["../model-r00000.safetensors"] = f["model-r00000.safetensors"]
		}, `files names "../model-r00000.safetensors", which is not the name of a file of the checkpoint's directory`},
		{"files sha256", func(m map[string]any) { obj(m, "files", "model-r00000.safetensors")["sha256"] = "abc" },
			`files["model-r00000.safetensors"].sha256 is "abc", not 64 hexadecimal digits`},
		{"files bytes", func(m map[string]any) { obj(m, "files", "model-r00000.safetensors")["bytes"] = -1 },
			`files["model-r00000.safetensors"].bytes is -1`},
		{"tensor steps", func(m map[string]any) { obj(m, "tensors", "wte.weight")["steps"] = 99 }, `tensors["wte.weight"].steps is 99, outside 0..4 (step)`},
		{"tensor weight_decay", func(m map[string]any) { obj(m, "tensors", "wte.weight")["weight_decay"] = -0.5 },
			`tensors["wte.weight"].weight_decay is -0.5, not a finite number 0 or more`},
		{"part file", func(m map[string]any) { part(m, "wpe.weight", "", 0)["file"] = "other.safetensors" },
			`tensors["wpe.weight"].parts[0].file is "other.safetensors", which files does not list`},
		{"part coord rank", func(m map[string]any) {
			part(m, "wte.weight", "", 0)["coord"].(map[string]any)["Rank"] = []any{0, 3, 0, 0}
		},
			`tensors["wte.weight"].parts[0].coord has rank 3 along dp, outside 0..0`},
		{"part coord size", func(m map[string]any) {
			part(m, "wte.weight", "exp_avg", 0)["coord"].(map[string]any)["Size"] = []any{1, 2, 1, 1}
		},
			`tensors["wte.weight"].state["exp_avg"][0].coord has 2 ranks along dp, but trainer.layout has 1`},
		{"part spec pending sum", func(m map[string]any) {
			part(m, "ln_f.bias", "", 0)["spec"].(map[string]any)["Along"].([]any)[3].(map[string]any)["Kind"] = 2
		}, `tensors["ln_f.bias"].parts[0].spec is a pending sum along tp, which a checkpoint never holds`},
		{"part spec shard outside", func(m map[string]any) {
			a := part(m, "ln_f.bias", "", 0)["spec"].(map[string]any)["Along"].([]any)[3].(map[string]any)
			a["Kind"], a["Offset"], a["Length"] = 1, 30, 8
		}, `tensors["ln_f.bias"].parts[0].spec: place: ln_f.bias: shard(dim 0, [30:38)) along tp is outside shape [32]`},
	}
	type damage struct {
		name   string
		damage func(dir string)
		want   func(dir string) string
	}
	var cases []damage
	for _, f := range fields {
		cases = append(cases, damage{f.name, func(dir string) { editJSON(t, dir, f.edit) },
			func(dir string) string { return "resume: ckpt: " + filepath.Join(dir, ckpt.IndexFile) + ": " + f.want }})
	}
	// Damage only the run resuming can see.
	index := func(dir string) string { return "resume: " + filepath.Join(dir, ckpt.IndexFile) + ": " }
	optim := func(dir string) string { return "resume: " + filepath.Join(dir, "optim-r00000.safetensors") + ": " }
	cases = append(cases,
		damage{"state of another optimizer", func(dir string) {
			editJSON(t, dir, func(m map[string]any) {
				st := obj(m, "tensors", "h.1.mlp.c_fc.weight", "state")
				st["momentum_buffer"] = st["exp_avg"]
				delete(st, "exp_avg")
			})
		}, func(dir string) string {
			return index(dir) + `tensors["h.1.mlp.c_fc.weight"].state has "momentum_buffer", which train.optimizer=adamw keeps no buffer of (it keeps exp_avg and exp_avg_sq)`
		}},
		damage{"state missing", func(dir string) {
			editJSON(t, dir, func(m map[string]any) { delete(obj(m, "tensors", "h.0.ln_1.bias", "state"), "exp_avg_sq") })
		}, func(dir string) string {
			return index(dir) + `tensors["h.0.ln_1.bias"] has had 4 optimizer steps but no exp_avg_sq state`
		}},
		damage{"a piece twice", func(dir string) {
			editJSON(t, dir, func(m map[string]any) {
				ti := obj(m, "tensors", "wpe.weight")
				ti["parts"] = append(ti["parts"].([]any), ti["parts"].([]any)[0])
			})
		}, func(string) string { return "resume: the parts of wpe.weight in the checkpoint hold element 0 twice" }},
		damage{"weight_decay of another run", func(dir string) {
			editJSON(t, dir, func(m map[string]any) { obj(m, "tensors", "ln_f.bias")["weight_decay"] = 0.1 })
		}, func(dir string) string {
			return index(dir) + `tensors["ln_f.bias"].weight_decay is 0.1, but this run's optimizer decays ln_f.bias by 0`
		}},
		damage{"NaN in exp_avg", func(dir string) { damageState(t, dir, "exp_avg/wte.weight", float32(math.NaN())) },
			func(dir string) string { return optim(dir) + "exp_avg/wte.weight: element 3 is NaN" + nonfinite }},
		damage{"infinity in exp_avg_sq", func(dir string) { damageState(t, dir, "exp_avg_sq/h.0.attn.c_attn.weight", float32(math.Inf(1))) },
			func(dir string) string {
				return optim(dir) + "exp_avg_sq/h.0.attn.c_attn.weight: element 3 is +Inf" + nonfinite
			}},
		damage{"negative exp_avg_sq", func(dir string) { damageState(t, dir, "exp_avg_sq/ln_f.weight", -2) },
			func(dir string) string {
				return optim(dir) + "exp_avg_sq/ln_f.weight: element 3 is -2, but exp_avg_sq is a mean of squares" + nonfinite
			}},
	)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), ckpt.StepDir(4))
			require.NoError(t, exec.Command("cp", "-r", good, dir).Run())
			c.damage(dir)
			cfg := smallConfig()
			cfg.Train.Steps, cfg.Train.EvalEvery, cfg.Resume = 6, 0, dir
			tr, err := New(cfg, Options{Train: corpus[:4000]})
			require.NoError(t, err)
			fresh := map[string][]float64{}
			for _, p := range tr.Model.Params() {
				fresh[p.Name] = p.Float64s()
			}
			_, err = tr.Run(context.Background())
			require.EqualError(t, err, c.want(dir))
			for _, p := range tr.Model.Params() {
				require.Equal(t, fresh[p.Name], p.Float64s(), "%s was changed by a refused checkpoint", p.Name)
			}
		})
	}

	// The undamaged copy resumes.
	dir := filepath.Join(t.TempDir(), ckpt.StepDir(4))
	require.NoError(t, exec.Command("cp", "-r", good, dir).Run())
	cfg.Checkpoint.Dir, cfg.Resume = "", dir
	tr, err = New(cfg, Options{Train: corpus[:4000]})
	require.NoError(t, err)
	res, err := tr.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, 2, res.StepsRun)
}
