package trainer

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// freeKeys may differ between a checkpoint's run and the run resuming it:
// the layout (as long as the global batch stays equal) and what only
// controls the run, not the numbers it computes (activation recomputation
// is bitwise the run without it).
var freeKeys = []string{
	"parallel.", "pp.", "tp.", "zero.", "ddp.", "comm.", "checkpoint.", "recompute.",
	"train.batch_size", "train.grad_accum", "train.steps", "train.threads", "train.log_every",
	"train.eval_every", "train.eval_batches", "train.peak_flops",
	"resume", "resume_allow_nonfinite", "save_to", "metrics_file", "trace", "init_from", "device",
}

func freeKey(k string) bool {
	for _, f := range freeKeys {
		if k == f || (strings.HasSuffix(f, ".") && strings.HasPrefix(k, f)) {
			return true
		}
	}
	return false
}

// CheckResume reports why the checkpoint of index ix cannot continue a
// run of cfg whose global batch is global: a key that differs beyond the
// layout, a different global batch.
func CheckResume(ix *ckpt.Index, cfg config.Config, global int) error {
	var diffs []string
	for k, v := range config.Values(cfg) {
		if freeKey(k) {
			continue
		}
		if was, ok := ix.Config[k]; ok && fmt.Sprint(was) != v {
			diffs = append(diffs, fmt.Sprintf("%s is %s here but %v in the checkpoint", k, v, was))
		}
	}
	sort.Strings(diffs)
	if g := ix.Trainer.GlobalBatch; g != global {
		diffs = append(diffs, fmt.Sprintf("the global batch (train.batch_size × train.grad_accum × data-parallel ranks) is %d here but %d in the checkpoint", global, g))
	}
	if len(diffs) > 0 {
		return fmt.Errorf("the checkpoint cannot continue this run: %s", strings.Join(diffs, "; "))
	}
	return nil
}

// LoadCheckpoint restores the checkpoint at dir (a step-NNNNNNN directory)
// into this rank's layout, whatever layout wrote it, and returns the
// number of steps it completed. It is collective. Rank 0 first checks the
// whole checkpoint (digests, every tensor present and whole, the config);
// only then does any rank change its state, so a checkpoint that cannot
// serve the run is refused before anything is half-loaded.
func (t *Trainer) LoadCheckpoint(dir string) (int, error) {
	base := t.Alloc.StartWindow()
	defer func() { t.loadPeak = max(t.loadPeak, t.Alloc.WindowPeak()-base) }()
	ix, err := ckpt.ReadIndex(dir)
	if err == nil && t.Rank == 0 {
		err = t.checkCheckpoint(dir, ix)
	}
	if err := t.agree("checking checkpoint "+dir, err); err != nil {
		return 0, err
	}
	err = t.loadState(dir, ix)
	if err := t.agree("loading checkpoint "+dir, err); err != nil {
		return 0, err
	}
	if t.scaler != nil && ix.Trainer.LossScale > 0 {
		t.scaler.scale, t.scaler.good = ix.Trainer.LossScale, ix.Trainer.LossScaleGood
	}
	return ix.Step, nil
}

// checkCheckpoint is rank 0's look at the whole checkpoint before anyone
// loads: the digests, every parameter present with the model's shape and
// covered exactly once, the optimizer state of the run's optimizer, each
// piece readable, and finite unless allowed.
func (t *Trainer) checkCheckpoint(dir string, ix *ckpt.Index) error {
	if err := ix.Verify(dir); err != nil {
		return err
	}
	global := t.Cfg.Train.BatchSize * t.Cfg.Train.GradAccum * t.DataSize
	if err := CheckResume(ix, t.Cfg, global); err != nil {
		return err
	}
	keeps := t.stateKinds()
	readers := map[string]*ckpt.Reader{}
	defer func() {
		for _, r := range readers {
			r.Close()
		}
	}()
	base, err := t.loraBase()
	if err != nil {
		return err
	}
	if ix.LoRABase != base {
		return fmt.Errorf("the checkpoint's adapters were trained on the base with SHA-256 %s, but this run's base (init_from=%q) has %s: resume with the base they were trained on",
			ix.LoRABase, t.Cfg.InitFrom, base)
	}
	for _, ps := range t.Model.Config.TrainedShapes() { // a frozen base is init_from's (lora.go)
		ti := ix.Tensors[ps.Name]
		if ti == nil {
			return fmt.Errorf("the checkpoint holds no tensor %s", ps.Name)
		}
		if fmt.Sprint(ti.Shape) != fmt.Sprint(ps.Shape) {
			return fmt.Errorf("tensor %s is %v in the checkpoint but %v in the model (check model.*)", ps.Name, ti.Shape, ps.Shape)
		}
		if ti.DType != t.DType().String() {
			return fmt.Errorf("tensor %s is %s in the checkpoint; the model is %s (check train.dtype)", ps.Name, ti.DType, t.DType())
		}
		kinds := []string{""}
		for k := range ti.State {
			if !slices.Contains(keeps, k) {
				return fmt.Errorf("%s: tensors[%q].state has %q, which train.optimizer=%s keeps no buffer of (it keeps %s)",
					filepath.Join(dir, ckpt.IndexFile), ps.Name, k, t.Cfg.Train.Optimizer, orNone(keeps))
			}
			kinds = append(kinds, k)
		}
		sort.Strings(kinds[1:])
		if ti.Steps > 0 { // AdamW's buffers exist after its first step (SGD counts none)
			for _, k := range keeps {
				if _, ok := ti.State[k]; !ok {
					return fmt.Errorf("%s: tensors[%q] has had %d optimizer steps but no %s state", filepath.Join(dir, ckpt.IndexFile), ps.Name, ti.Steps, k)
				}
			}
		}
		for _, kind := range kinds {
			parts := ti.Parts
			what := ps.Name
			if kind != "" {
				parts, what = ti.State[kind], kind+" of "+ps.Name
			}
			var runs []run
			for _, p := range parts {
				r, err := t.reader(readers, dir, p.File)
				if err != nil {
					return err
				}
				n := p.Spec.HeldElements(p.Coord)
				if got := r.Numel(p.Key); got < 0 {
					return fmt.Errorf("%s holds no tensor %s, which the index names as a piece of %s", filepath.Join(dir, p.File), p.Key, ps.Name)
				} else if got != n {
					return fmt.Errorf("%s: tensor %s holds %d elements of %s; its placement says %d", filepath.Join(dir, p.File), p.Key, got, ps.Name, n)
				}
				runs = append(runs, runsOf(p.Spec, p.Coord)...)
				if t.Cfg.ResumeAllowNonfinite {
					continue
				}
				if err := t.checkStored(r, p.Key, kind, n); err != nil {
					return fmt.Errorf("%s: %s: %w (set resume_allow_nonfinite to load it anyway)", filepath.Join(dir, p.File), p.Key, err)
				}
			}
			if err := tiles(runs, tensor.Numel(ps.Shape), what); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkStored reads n elements of tensor key and reports the first that
// is not finite, or (for exp_avg_sq, a mean of squares) negative. It
// reads through a buffer of at most checkChunk elements (16 KiB in
// float32), so checking a piece as large as a whole tensor costs rank 0
// no tensor-sized buffer.
func (t *Trainer) checkStored(r *ckpt.Reader, key, kind string, n int) error {
	buf := t.Alloc.NewUninit(tensor.Comm, t.DType(), min(n, checkChunk))
	defer buf.Release()
	for at := 0; at < n; at += checkChunk {
		m := min(n-at, checkChunk)
		if err := r.ReadRange(key, at, m, buf, 0); err != nil {
			return err
		}
		if i, bad := firstNonFinite(buf.Span(0, m)); bad {
			return fmt.Errorf("element %d is %v", at+i, buf.At(i))
		}
		if kind == "exp_avg_sq" {
			for i := 0; i < m; i++ {
				if v := buf.At(i); v < 0 {
					return fmt.Errorf("element %d is %v, but exp_avg_sq is a mean of squares", at+i, v)
				}
			}
		}
	}
	return nil
}

// checkChunk is the elements checkStored reads at a time.
const checkChunk = 1 << 12

// tiles reports whether runs (global element ranges) cover [0, numel)
// exactly once: a gap would leave elements unloaded, an overlap means
// the index describes a piece twice.
func tiles(runs []run, numel int, what string) error {
	sort.Slice(runs, func(i, j int) bool { return runs[i].g < runs[j].g })
	covered, at := 0, 0
	for _, r := range runs {
		if r.g < at {
			return fmt.Errorf("the parts of %s in the checkpoint hold element %d twice", what, r.g)
		}
		covered += r.n
		at = r.g + r.n
	}
	if covered != numel {
		return fmt.Errorf("the parts of %s in the checkpoint hold %d of its %d elements (a missing file?)", what, covered, numel)
	}
	return nil
}

// stateKinds are the optimizer buffers train.optimizer keeps per parameter.
func (t *Trainer) stateKinds() []string {
	switch {
	case t.Cfg.Train.Optimizer != "sgd":
		return []string{"exp_avg", "exp_avg_sq"}
	case t.Cfg.Train.Momentum != 0:
		return []string{"momentum_buffer"}
	}
	return nil
}

func orNone(kinds []string) string {
	if len(kinds) == 0 {
		return "none"
	}
	return strings.Join(kinds, " and ")
}

func (t *Trainer) reader(readers map[string]*ckpt.Reader, dir, file string) (*ckpt.Reader, error) {
	if r := readers[file]; r != nil {
		return r, nil
	}
	r, err := ckpt.Open(filepath.Join(dir, file))
	if err != nil {
		return nil, err
	}
	readers[file] = r
	return r, nil
}

// loadState fills every part this rank holds from the checkpoint.
func (t *Trainer) loadState(dir string, ix *ckpt.Index) error {
	readers := map[string]*ckpt.Reader{}
	defer func() {
		for _, r := range readers {
			r.Close()
		}
	}()
	c := t.Coord()
	// The weight decay the index records is the run's (train.weight_decay
	// is a key a resumed run keeps, and the optimizer applies it by
	// parameter); checked for every parameter before any is loaded.
	for _, p := range t.Model.Params() {
		if !kept(p) {
			continue // a frozen base, filled from init_from at construction
		}
		ti := ix.Tensors[p.Name]
		if ti == nil {
			return fmt.Errorf("the checkpoint holds no tensor %s", p.Name)
		}
		h, err := t.Holding(p)
		if err != nil {
			return err
		}
		if h.Opt == nil || h.OptParam == nil || len(ti.State) == 0 {
			continue
		}
		if d := h.Opt.DecayOf(h.OptParam); d != ti.WeightDecay {
			return fmt.Errorf("%s: tensors[%q].weight_decay is %v, but this run's optimizer decays %s by %v", filepath.Join(dir, ckpt.IndexFile), p.Name, ti.WeightDecay, p.Name, d)
		}
	}
	for _, p := range t.Model.Params() {
		if !kept(p) {
			continue
		}
		ti := ix.Tensors[p.Name]
		h, err := t.Holding(p)
		if err != nil {
			return err
		}
		if h.Value.Data != nil {
			if err := t.fill(readers, dir, p.Name, h.Value.Data, h.Value.Spec, c, ti.Parts); err != nil {
				return err
			}
		}
		if h.Opt == nil || h.OptParam == nil {
			continue
		}
		for kind, parts := range ti.State {
			dst, err := h.Opt.EnsureState(h.OptParam, kind)
			if err != nil {
				return fmt.Errorf("optimizer state %s of %s: %w (was the checkpoint written with another train.optimizer?)", kind, p.Name, err)
			}
			if err := t.fill(readers, dir, kind+" of "+p.Name, dst, h.Grad.Spec, c, parts); err != nil {
				return err
			}
		}
		h.Opt.SetStepsOf(h.OptParam, ti.Steps)
	}
	return nil
}

// run is n consecutive elements at global index g, at index l of its data.
type run struct{ g, l, n int }

func runsOf(s *place.Spec, c place.Coord) []run {
	var out []run
	s.Runs(c, func(g, l, n int) { out = append(out, run{g, l, n}) })
	sort.Slice(out, func(i, j int) bool { return out[i].g < out[j].g })
	return out
}

// fill writes into dst (laid out as spec says for this rank) every element
// it holds, reading from the stored pieces that overlap it only the byte
// ranges it holds, straight into dst: loading adds no buffer of a
// piece's size, whatever layout wrote the checkpoint.
func (t *Trainer) fill(readers map[string]*ckpt.Reader, dir, what string, dst *tensor.Tensor, spec *place.Spec, c place.Coord, parts []ckpt.Part) error {
	want := runsOf(spec, c)
	need := 0
	for _, r := range want {
		need += r.n
	}
	got := 0
	for _, p := range parts {
		have := runsOf(p.Spec, p.Coord)
		var pairs [][2]run // overlapping (dst, src) runs, clipped
		i, j := 0, 0
		for i < len(want) && j < len(have) {
			a, b := want[i], have[j]
			lo, hi := max(a.g, b.g), min(a.g+a.n, b.g+b.n)
			if lo < hi {
				pairs = append(pairs, [2]run{{lo, a.l + lo - a.g, hi - lo}, {lo, b.l + lo - b.g, hi - lo}})
			}
			if a.g+a.n < b.g+b.n {
				i++
			} else {
				j++
			}
		}
		if len(pairs) == 0 {
			continue
		}
		r, err := t.reader(readers, dir, p.File)
		if err != nil {
			return err
		}
		for _, pr := range pairs {
			d, s := pr[0], pr[1]
			if err := r.ReadRange(p.Key, s.l, s.n, dst, d.l); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			got += d.n
		}
	}
	if got != need {
		return errors.New(what + fmt.Sprintf(": the checkpoint covers %d of the %d elements this rank holds", got, need))
	}
	return nil
}
