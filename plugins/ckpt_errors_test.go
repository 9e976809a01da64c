package plugins

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/mesh"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// zero3Checkpoint writes a ZeRO-3 dp 2 checkpoint after 2 steps and
// returns its step directory.
func zero3Checkpoint(t *testing.T) string {
	cfg := layouts[5].config(2)
	cfg.Checkpoint.Dir = filepath.Join(t.TempDir(), "ckpt")
	ptest.Parallel(t, cfg, 2, "local", func(g comm.Group) ([]trainer.Plugin, *mesh.Mesh, error) { return Build(cfg, g) })
	return filepath.Join(cfg.Checkpoint.Dir, ckpt.StepDir(2))
}

// editIndex rewrites index.json through f; with redigest, the files'
// digests are recomputed afterwards (a damage the digests cannot see).
func editIndex(t *testing.T, dir string, redigest bool, f func(ix *ckpt.Index)) {
	ix, err := ckpt.ReadIndex(dir)
	require.NoError(t, err)
	f(ix)
	if redigest {
		for name := range ix.Files {
			fi, err := ckpt.Digest(filepath.Join(dir, name))
			require.NoError(t, err)
			ix.Files[name] = fi
		}
	}
	b, err := json.Marshal(ix)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, ckpt.IndexFile), b, 0o644))
}

// TestBadCheckpointsAreRefused damages a checkpoint in each of the ways a
// disk or a person can, and resumes from it in one process: each is
// refused before any training, naming the file and the tensor, and the
// model is left as initialised.
func TestBadCheckpointsAreRefused(t *testing.T) {
	good := zero3Checkpoint(t)
	cases := []struct {
		name   string
		damage func(dir string)
		want   string // a regular expression
	}{
		{"truncated file", func(dir string) {
			require.NoError(t, os.Truncate(filepath.Join(dir, "model-r00001.safetensors"), 100))
		}, `model-r00001\.safetensors \(pieces of .*\) does not match its digest in index\.json \(100 bytes`},
		{"flipped byte", func(dir string) {
			path := filepath.Join(dir, "optim-r00000.safetensors")
			b, err := os.ReadFile(path)
			require.NoError(t, err)
			b[len(b)-5] ^= 0x40
			require.NoError(t, os.WriteFile(path, b, 0o644))
		}, `optim-r00000\.safetensors \(pieces of h\.0\.attn\.c_attn\.bias, h\.0\.attn\.c_attn\.weight, h\.0\.attn\.c_proj\.bias and \d+ more tensors\) does not match its digest`},
		{"missing shard", func(dir string) {
			require.NoError(t, os.Remove(filepath.Join(dir, "model-r00001.safetensors")))
		}, `model-r00001\.safetensors \(pieces of .*\): open .*: no such file or directory`},
		{"index names a tensor no file holds", func(dir string) {
			editIndex(t, dir, false, func(ix *ckpt.Index) {
				ix.Tensors["wpe.weight"].Parts[0].Key = "wpe.weight.typo"
			})
		}, `model-r0000\d\.safetensors holds no tensor wpe\.weight\.typo, which the index names as a piece of wpe\.weight`},
		{"wrong shape", func(dir string) {
			editIndex(t, dir, false, func(ix *ckpt.Index) {
				// A checkpoint of another model: its pieces agree with it.
				ti := ix.Tensors["ln_f.bias"]
				ti.Shape = []int{33}
				parts := ti.Parts
				for _, ps := range ti.State {
					parts = append(parts, ps...)
				}
				for _, p := range parts {
					p.Spec.Shape = []int{33}
				}
			})
		}, `tensor ln_f\.bias is \[33\] in the checkpoint but \[32\] in the model \(check model\.\*\)`},
		{"wrong dtype", func(dir string) {
			editIndex(t, dir, false, func(ix *ckpt.Index) { ix.Tensors["ln_f.bias"].DType = "float64" })
		}, `tensor ln_f\.bias is float64 in the checkpoint; the model is float32`},
		{"header length larger than the file", func(dir string) {
			path := filepath.Join(dir, "model-r00000.safetensors")
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			require.NoError(t, err)
			var n [8]byte
			binary.LittleEndian.PutUint64(n[:], 1<<40)
			_, err = f.WriteAt(n[:], 0)
			require.NoError(t, err)
			require.NoError(t, f.Close())
			editIndex(t, dir, true, func(*ckpt.Index) {})
		}, `model-r00000\.safetensors.*header`},
		{"NaN in a weight", func(dir string) {
			path := filepath.Join(dir, "model-r00000.safetensors")
			r, err := ckpt.Open(path)
			require.NoError(t, err)
			require.Positive(t, r.Numel("wte.weight"))
			require.NoError(t, r.Close())
			ts, meta, err := ckpt.Load(path)
			require.NoError(t, err)
			ts["wte.weight"].F32()[3] = float32(math.NaN())
			require.NoError(t, ckpt.Save(path, ts, meta))
			editIndex(t, dir, true, func(*ckpt.Index) {})
		}, `model-r00000\.safetensors: wte\.weight: element 3 is NaN \(set resume_allow_nonfinite to load it anyway\)`},
	}
	init, err := trainer.New(layouts[0].config(4), trainer.Options{Train: ptest.Corpus()})
	require.NoError(t, err)
	fresh := map[string][]float64{}
	for _, p := range init.Model.Params() {
		fresh[p.Name] = p.Float64s()
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), ckpt.StepDir(2))
			require.NoError(t, exec.Command("cp", "-r", good, dir).Run())
			c.damage(dir)
			cfg := layouts[0].config(4)
			cfg.Resume = dir
			tr, err := trainer.New(cfg, trainer.Options{Train: ptest.Corpus()})
			require.NoError(t, err)
			_, err = tr.Run(context.Background())
			require.Error(t, err)
			require.Regexp(t, c.want, err.Error())
			for _, p := range tr.Model.Params() {
				require.Equal(t, fresh[p.Name], p.Float64s(), "%s: %s was changed by a refused checkpoint", c.name, p.Name)
			}
		})
	}
	// The NaN checkpoint loads when asked to.
	dir := filepath.Join(t.TempDir(), ckpt.StepDir(2))
	require.NoError(t, exec.Command("cp", "-r", good, dir).Run())
	cases[len(cases)-1].damage(dir)
	cfg := layouts[0].config(3)
	cfg.Resume, cfg.ResumeAllowNonfinite = dir, true
	tr, err := trainer.New(cfg, trainer.Options{Train: ptest.Corpus()})
	require.NoError(t, err)
	_, err = tr.LoadCheckpoint(dir)
	require.NoError(t, err)
	require.True(t, math.IsNaN(float64(tr.Model.Param("wte.weight").F32()[3])))
}
