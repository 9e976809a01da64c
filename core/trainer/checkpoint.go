package trainer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// A checkpoint is written by every rank at once: each writes the pieces of
// the model and of the optimizer state it owns (place.Spec.Owns: each
// global element by exactly one rank) into its own files, with a
// description of the pieces; rank 0 then checks every file's digest into
// the index, renames the directory into place and moves the latest
// pointer. Only the tensors a rank already holds are written, one at a
// time: no rank gathers the model.

// checkpointHook, when set (tests only), runs once every rank has written
// its files and before rank 0 completes the checkpoint: where a kill
// mid-save is most harmful.
var checkpointHook func(step int)

// rankFiles names the files rank r writes into a checkpoint.
func rankFiles(r int) (model, optim, parts string) {
	return fmt.Sprintf("model-r%05d.safetensors", r), fmt.Sprintf("optim-r%05d.safetensors", r), fmt.Sprintf("parts-r%05d.json", r)
}

// rankParts is what one rank wrote: per global tensor, its value piece and
// its optimizer-state pieces, with the parameter's step count and decay.
type rankParts map[string]*ckpt.TensorInfo

// SaveCheckpoint writes the training state after step completed steps to
// root/step-NNNNNNN and returns that directory. It is collective: every
// rank calls it. A failure on any rank fails it on every rank, leaves the
// previous checkpoints and the latest pointer as they were, and removes
// the partial directory (every rank is done with it once they agreed).
func (t *Trainer) SaveCheckpoint(root string, step int) (dir string, err error) {
	base := t.Alloc.StartWindow()
	defer func() { t.savePeak = max(t.savePeak, t.Alloc.WindowPeak()-base) }()
	final := filepath.Join(root, ckpt.StepDir(step))
	tmp := filepath.Join(root, ckpt.PartialDir(step))
	defer func() {
		if err != nil && t.Rank == 0 {
			os.RemoveAll(tmp)
		}
	}()
	if t.Rank == 0 {
		err = os.MkdirAll(root, 0o755)
		if err == nil {
			err = os.RemoveAll(tmp)
		}
		if err == nil {
			err = os.Mkdir(tmp, 0o755)
		}
	}
	if err := t.agree("creating the checkpoint directory "+tmp, err); err != nil {
		return "", err
	}
	err = t.writeRankFiles(tmp)
	if err := t.agree("writing checkpoint files into "+tmp, err); err != nil {
		return "", err
	}
	if checkpointHook != nil {
		checkpointHook(step)
	}
	if t.Rank == 0 {
		err = t.finishCheckpoint(root, tmp, final, step)
	}
	if err := t.agree("completing checkpoint "+final, err); err != nil {
		return "", err
	}
	return final, nil
}

// writeRankFiles writes this rank's model and optimizer pieces and their
// description into dir.
func (t *Trainer) writeRankFiles(dir string) error {
	c := t.Coord()
	modelFile, optFile, partsFile := rankFiles(t.Rank)
	parts := rankParts{}
	var modelEntries, optEntries []ckpt.Entry
	modelData, optData := map[string]*tensor.Tensor{}, map[string]*tensor.Tensor{}
	for _, p := range t.Model.Params() {
		if !kept(p) {
			continue // a frozen base: init_from holds it (lora.go)
		}
		h, err := t.Holding(p)
		if err != nil {
			return err
		}
		info := &ckpt.TensorInfo{Shape: h.Value.Spec.Shape, DType: p.DType().String()}
		if own, err := h.Value.Spec.Owns(c); err != nil {
			return err
		} else if own && h.Value.Data != nil && h.Value.Data.Numel() > 0 {
			if i, bad := firstNonFinite(h.Value.Data); bad {
				return fmt.Errorf("parameter %s holds a non-finite value (element %d of this rank's part is %v); a checkpoint of it would be worthless", p.Name, i, h.Value.Data.At(i))
			}
			d := h.Value.Data.Reshape(h.Value.Data.Numel())
			modelEntries = append(modelEntries, ckpt.Entry{Name: p.Name, DType: d.DType(), Shape: d.Shape()})
			modelData[p.Name] = d
			info.Parts = []ckpt.Part{{File: modelFile, Key: p.Name, Spec: h.Value.Spec, Coord: c}}
		}
		if own, err := h.Grad.Spec.Owns(c); err != nil {
			return err
		} else if own && h.Opt != nil && h.OptParam != nil {
			bufs, steps := h.Opt.StateOf(h.OptParam)
			info.Steps, info.WeightDecay = steps, h.Opt.DecayOf(h.OptParam)
			info.State = map[string][]ckpt.Part{}
			for kind, b := range bufs {
				key := kind + "/" + p.Name
				d := b.Reshape(b.Numel())
				optEntries = append(optEntries, ckpt.Entry{Name: key, DType: d.DType(), Shape: d.Shape()})
				optData[key] = d
				info.State[kind] = []ckpt.Part{{File: optFile, Key: key, Spec: h.Grad.Spec, Coord: c}}
			}
		}
		if len(info.Parts) > 0 || len(info.State) > 0 {
			parts[p.Name] = info
		}
	}
	meta := map[string]string{"producer": "tinyacc", "kind": "checkpoint"}
	for _, f := range []struct {
		name    string
		entries []ckpt.Entry
		data    map[string]*tensor.Tensor
	}{{modelFile, modelEntries, modelData}, {optFile, optEntries, optData}} {
		if len(f.entries) == 0 {
			continue
		}
		err := ckpt.SaveStream(filepath.Join(dir, f.name), f.entries, meta, func(name string) (*tensor.Tensor, error) { return f.data[name], nil })
		if err != nil {
			return err
		}
	}
	b, err := json.Marshal(parts)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, partsFile), b, 0o644)
}

// finishCheckpoint (rank 0) merges the ranks' descriptions into the index
// with every file's digest, renames tmp to final and moves the latest
// pointer, then drops checkpoints beyond checkpoint.keep_last.
func (t *Trainer) finishCheckpoint(root, tmp, final string, step int) error {
	ix := &ckpt.Index{Format: ckpt.IndexFormat, Version: ckpt.IndexVersion, Step: step,
		Files: map[string]ckpt.FileInfo{}, Tensors: map[string]*ckpt.TensorInfo{}, Trainer: t.trainerState(step), Config: map[string]any{}}
	for k, v := range config.Values(t.Cfg) {
		ix.Config[k] = v
	}
	for r := 0; r < t.World; r++ {
		_, _, partsFile := rankFiles(r)
		b, err := os.ReadFile(filepath.Join(tmp, partsFile))
		if err != nil {
			return err
		}
		var parts rankParts
		if err := json.Unmarshal(b, &parts); err != nil {
			return fmt.Errorf("%s: %w", partsFile, err)
		}
		for name, info := range parts {
			ti := ix.Tensors[name]
			if ti == nil {
				ti = &ckpt.TensorInfo{Shape: info.Shape, DType: info.DType, State: map[string][]ckpt.Part{}}
				ix.Tensors[name] = ti
			}
			ti.Parts = append(ti.Parts, info.Parts...)
			for kind, ps := range info.State {
				ti.State[kind] = append(ti.State[kind], ps...)
				ti.Steps, ti.WeightDecay = info.Steps, info.WeightDecay
			}
		}
		if err := os.Remove(filepath.Join(tmp, partsFile)); err != nil {
			return err
		}
	}
	for _, ps := range t.Model.Config.TrainedShapes() {
		if ix.Tensors[ps.Name] == nil || len(ix.Tensors[ps.Name].Parts) == 0 {
			return fmt.Errorf("no rank wrote parameter %s", ps.Name)
		}
	}
	base, err := t.loraBase()
	if err != nil {
		return err
	}
	ix.LoRABase = base
	entries, err := os.ReadDir(tmp)
	if err != nil {
		return err
	}
	for _, e := range entries {
		fi, err := ckpt.Digest(filepath.Join(tmp, e.Name()))
		if err != nil {
			return err
		}
		ix.Files[e.Name()] = fi
	}
	b, err := json.MarshalIndent(ix, "", " ")
	if err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(tmp, ckpt.IndexFile), b); err != nil {
		return err
	}
	if err := os.RemoveAll(final); err != nil {
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(root, ckpt.LatestFile), []byte(filepath.Base(final)+"\n")); err != nil {
		return err
	}
	return pruneCheckpoints(root, t.Cfg.Checkpoint.KeepLast, filepath.Base(final))
}

// trainerState is the loop's position after step completed steps.
func (t *Trainer) trainerState(step int) ckpt.TrainerState {
	c := t.Cfg
	B, A := c.Train.BatchSize, c.Train.GradAccum
	global := B * A * t.DataSize
	s := ckpt.TrainerState{Step: step, ScheduleStep: step, Seed: c.Train.Seed, DataOrder: c.Data.Order, GlobalBatch: global,
		Layout: map[string]int{"world": t.World, "dp": t.DataSize, "batch_size": B, "grad_accum": A,
			"tp": c.Parallel.TP, "pp": c.Parallel.PP, "cp": c.Parallel.CP, "zero_stage": c.Zero.Stage}}
	if t.scaler != nil {
		s.LossScale, s.LossScaleGood = t.scaler.scale, t.scaler.good
	}
	// Data-parallel rank r reads samples a·N·B + r·B + j of each step
	// (data.Loader.Batch): its next sample is step·G + r·B.
	for r := 0; r < t.DataSize; r++ {
		s.DataPositions = append(s.DataPositions, int64(step)*int64(global)+int64(r)*int64(B))
	}
	return s
}

// pruneCheckpoints removes the oldest complete checkpoints beyond keep
// (0 = keep all), never the one just written.
func pruneCheckpoints(root string, keep int, newest string) error {
	if keep <= 0 {
		return nil
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return err
	}
	var steps []string
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), "step-") {
			steps = append(steps, e.Name())
		}
	}
	sort.Strings(steps) // zero-padded: name order is step order
	for len(steps) > keep {
		if steps[0] != newest {
			if err := os.RemoveAll(filepath.Join(root, steps[0])); err != nil {
				return err
			}
		}
		steps = steps[1:]
	}
	return nil
}

// writeFileAtomic writes b to a temporary file beside path and renames it
// over path.
func writeFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// agree tells every rank whether any rank failed at what: err is this
// rank's outcome. A rank that succeeded learns which rank failed.
func (t *Trainer) agree(what string, err error) error {
	w := t.world()
	if w == nil {
		return err
	}
	flag := 0.0
	if err != nil {
		flag = float64(w.Rank() + 1)
	}
	buf := tensor.FromF64([]float64{flag}, 1)
	if cerr := w.AllReduce(buf, comm.Max); cerr != nil {
		if err != nil {
			return err
		}
		return fmt.Errorf("%s: agreeing on the outcome: %w", what, cerr)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if r := int(buf.F64()[0]); r > 0 {
		return fmt.Errorf("%s failed on rank %d", what, r-1)
	}
	return nil
}

// CheckOutputs makes sure every output path of cfg (save_to, checkpoint.dir,
// metrics_file, trace) can be written, so an unwritable path is reported
// before the first step rather than after hours of training.
func CheckOutputs(cfg config.Config) error {
	dirs := []struct{ key, dir string }{
		{"save_to", parentOf(cfg.SaveTo)},
		{"checkpoint.dir", cfg.Checkpoint.Dir},
		{"metrics_file", parentOf(cfg.MetricsFile)},
		{"trace", parentOf(cfg.Trace)},
	}
	for _, d := range dirs {
		if err := OutputDir(d.key, d.dir); err != nil {
			return err
		}
	}
	return nil
}

// OutputDir is the one rule for every directory tinyacc writes an output
// into (train's save_to, checkpoint.dir, metrics_file and trace, export's
// --to): a missing directory is created, with its missing parents, and
// must then accept a file. key names the setting in the error.
func OutputDir(key, dir string) error {
	if dir == "" {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("%s: cannot create %s: %w", key, dir, err)
	}
	f, err := os.CreateTemp(dir, ".tinyacc-write-check-*")
	if err != nil {
		return fmt.Errorf("%s: cannot write into %s: %w", key, dir, err)
	}
	f.Close()
	os.Remove(f.Name())
	return nil
}

func parentOf(path string) string {
	if path == "" {
		return ""
	}
	return filepath.Dir(path)
}
