package ckpt

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/tinyacc/tinyacc/core/place"
)

// check reports the first value of the index (read from dir) that is out
// of range or disagrees with another: an index is written by rank 0 from
// values that always agree, so a disagreement is damage or an edit, and a
// value used as an index or a count must never reach the code that uses
// it unchecked. Each message names the field as index.json spells it.
// What depends on the run resuming (its model, its optimizer, its
// train.steps) is checked by the trainer.
func (ix *Index) check(dir string) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("ckpt: %s: %s", filepath.Join(dir, IndexFile), fmt.Sprintf(format, args...))
	}
	if ix.Step < 1 {
		return bad("step is %d, but a checkpoint is written after 1 or more steps", ix.Step)
	}
	if n, ok := ParseStepDir(filepath.Base(dir)); ok && n != ix.Step {
		return bad("step is %d, but the checkpoint's directory is %s", ix.Step, filepath.Base(dir))
	}
	tr := ix.Trainer
	if tr.Step != ix.Step {
		return bad("trainer.step is %d, but step is %d", tr.Step, ix.Step)
	}
	if tr.ScheduleStep != ix.Step {
		return bad("trainer.schedule_step is %d, but step is %d", tr.ScheduleStep, ix.Step)
	}
	if err := ix.checkLayout(bad); err != nil {
		return err
	}
	for _, c := range []struct {
		field, key string
		v          any
	}{
		{"trainer.seed", "train.seed", tr.Seed},
		{"trainer.data_order", "data.order", tr.DataOrder},
	} {
		if err := ix.agreesWithConfig(bad, c.field, c.key, c.v); err != nil {
			return err
		}
	}
	for _, name := range slices.Sorted(maps.Keys(ix.Files)) {
		fi := ix.Files[name]
		if !plainName(name) {
			return bad("files names %s, which is not the name of a file of the checkpoint's directory", quoteCut(name, 64))
		}
		if b, err := hex.DecodeString(fi.SHA256); err != nil || len(b) != 32 {
			return bad("files[%q].sha256 is %s, not 64 hexadecimal digits", name, quoteCut(fi.SHA256, 80))
		}
		if fi.Bytes < 0 {
			return bad("files[%q].bytes is %d", name, fi.Bytes)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(ix.Tensors)) {
		ti := ix.Tensors[name]
		if ti == nil {
			return bad("tensors[%q] is null", name)
		}
		if ti.Steps < 0 || ti.Steps > ix.Step {
			return bad("tensors[%q].steps is %d, outside 0..%d (step)", name, ti.Steps, ix.Step)
		}
		if math.IsNaN(ti.WeightDecay) || math.IsInf(ti.WeightDecay, 0) || ti.WeightDecay < 0 {
			return bad("tensors[%q].weight_decay is %v, not a finite number 0 or more", name, ti.WeightDecay)
		}
		for _, d := range ti.Shape {
			if d < 0 {
				return bad("tensors[%q].shape %v has a negative dimension", name, ti.Shape)
			}
		}
		kinds := []string{""}
		for k := range ti.State {
			kinds = append(kinds, k)
		}
		sort.Strings(kinds[1:])
		for _, kind := range kinds {
			field := fmt.Sprintf("tensors[%q].parts", name)
			parts := ti.Parts
			if kind != "" {
				field = fmt.Sprintf("tensors[%q].state[%q]", name, kind)
				parts = ti.State[kind]
			}
			for i, p := range parts {
				if err := ix.checkPart(bad, fmt.Sprintf("%s[%d]", field, i), name, ti, p); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// checkLayout checks trainer.layout against itself, the global batch, the
// data positions and the config it records.
func (ix *Index) checkLayout(bad func(string, ...any) error) error {
	tr := ix.Trainer
	l := tr.Layout
	for _, k := range []string{"world", "dp", "tp", "pp", "cp", "batch_size", "grad_accum"} {
		if v, ok := l[k]; !ok || v < 1 {
			return bad("trainer.layout.%s is %s; world, dp, tp, pp, cp, batch_size and grad_accum are each 1 or more", k, shown(v, ok))
		}
	}
	if z := l["zero_stage"]; z < 0 || z > 3 {
		return bad("trainer.layout.zero_stage is %d, not 0 to 3", z)
	}
	if n := l["dp"] * l["tp"] * l["pp"] * l["cp"]; n != l["world"] {
		return bad("trainer.layout has dp %d × tp %d × pp %d × cp %d = %d ranks, but world is %d", l["dp"], l["tp"], l["pp"], l["cp"], n, l["world"])
	}
	if g := l["batch_size"] * l["grad_accum"] * l["dp"]; tr.GlobalBatch != g {
		return bad("trainer.global_batch is %d, but trainer.layout gives batch_size %d × grad_accum %d × dp %d = %d", tr.GlobalBatch, l["batch_size"], l["grad_accum"], l["dp"], g)
	}
	for _, c := range []struct{ field, key string }{
		{"batch_size", "train.batch_size"}, {"grad_accum", "train.grad_accum"},
		{"tp", "parallel.tp"}, {"pp", "parallel.pp"}, {"cp", "parallel.cp"}, {"zero_stage", "zero.stage"},
	} {
		if err := ix.agreesWithConfig(bad, "trainer.layout."+c.field, c.key, l[c.field]); err != nil {
			return err
		}
	}
	if len(tr.DataPositions) != l["dp"] {
		return bad("trainer.data_positions has %d entries, but trainer.layout.dp is %d", len(tr.DataPositions), l["dp"])
	}
	for r, pos := range tr.DataPositions {
		// Data-parallel rank r's next sample: step·G + r·B.
		if want := int64(ix.Step)*int64(tr.GlobalBatch) + int64(r)*int64(l["batch_size"]); pos != want {
			return bad("trainer.data_positions[%d] is %d, but data-parallel rank %d reads sample %d next (step × global_batch + rank × batch_size)", r, pos, r, want)
		}
	}
	return nil
}

// agreesWithConfig checks an index-only field against the value the index's
// config records for key, when it records one.
func (ix *Index) agreesWithConfig(bad func(string, ...any) error, field, key string, v any) error {
	was, ok := ix.Config[key]
	if !ok {
		return nil
	}
	b, _ := json.Marshal(v)
	if string(b) != fmt.Sprint(was) {
		return bad("%s is %s, but config %s is %v", field, b, key, was)
	}
	return nil
}

// checkPart checks one piece of tensor name: a file the index lists, a
// placement that fits the tensor's shape, and a coordinate on the mesh of
// trainer.layout.
func (ix *Index) checkPart(bad func(string, ...any) error, field, name string, ti *TensorInfo, p Part) error {
	if _, ok := ix.Files[p.File]; !ok {
		return bad("%s.file is %s, which files does not list", field, quoteCut(p.File, 64))
	}
	s := p.Spec
	if s == nil {
		return bad("%s.spec is missing", field)
	}
	if s.Name != name {
		return bad("%s.spec names %s, not %s", field, quoteCut(s.Name, 64), name)
	}
	if fmt.Sprint(s.Shape) != fmt.Sprint(ti.Shape) {
		return bad("%s.spec has shape %v, but the tensor's is %v", field, s.Shape, ti.Shape)
	}
	if err := s.Validate(); err != nil {
		return bad("%s.spec: %v", field, err)
	}
	l := ix.Trainer.Layout
	size := [place.NumAxes]int{place.PP: l["pp"], place.DP: l["dp"], place.CP: l["cp"], place.TP: l["tp"]}
	for a := place.Axis(0); a < place.NumAxes; a++ {
		if p.Coord.Size[a] != size[a] {
			return bad("%s.coord has %d ranks along %s, but trainer.layout has %d", field, p.Coord.Size[a], a, size[a])
		}
		if r := p.Coord.Rank[a]; r < 0 || r >= size[a] {
			return bad("%s.coord has rank %d along %s, outside 0..%d", field, r, a, size[a]-1)
		}
		switch pl := s.Along[a]; pl.Kind {
		case place.Replicate, place.Shard, place.Flat:
		case place.Held:
			for _, r := range pl.Ranks {
				if r < 0 || r >= size[a] {
					return bad("%s.spec holds it on rank %d along %s, outside 0..%d", field, r, a, size[a]-1)
				}
			}
		case place.Partial:
			return bad("%s.spec is a pending sum along %s, which a checkpoint never holds", field, a)
		default:
			return bad("%s.spec has placement kind %d along %s, which is none of replicate, shard, partial, held, flat", field, int(pl.Kind), a)
		}
	}
	return nil
}

// plainName reports whether name is a file name of one directory: not
// empty, no separator, not . or ..; what the index names is read only
// from the checkpoint's own directory.
func plainName(name string) bool {
	return name != "" && name != "." && name != ".." && !strings.ContainsAny(name, `/\`)
}

// shown is a layout value for a message, or "missing".
func shown(v int, ok bool) string {
	if !ok {
		return "missing"
	}
	return fmt.Sprint(v)
}
