package trainer

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/tinyacc/tinyacc/core/ckpt"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// Construction by placement. New never builds the whole model on a rank:
//
//  1. describe: nn.Describe gives every parameter its name, global shape
//     and a replicated placement, and no storage;
//  2. place: the plugins' Prepare hooks run on the description and say
//     where each parameter lives (tensor parallel registers shards, a
//     pipeline keeps its stage, ZeRO lays its units out in flat buffers
//     and keeps its shard), allocating only what they hold;
//  3. allocate: every parameter no plugin holds gets storage for its
//     local part (materialize);
//  4. fill: every part this rank holds, found through Holding as for
//     any other use of a parameter's value, is written from the initial
//     values (a function of seed, name and element index) or from the
//     byte ranges of init_from that hold it;
//  5. the optimizer is built over the local parts, unless a plugin
//     built its own (ZeRO's over its shard).
//
// So a rank's allocator never holds more than its own parts plus what a
// plugin states it borrows, during construction as during training.

// construct runs steps 2 to 5 on t.Model, which is described: the
// plugins place it, this rank allocates and fills its parts with fill,
// and, with withOpt, the optimizer is built over them unless a plugin
// built its own. New and NewPlaced both construct through it.
func (t *Trainer) construct(fill partFiller, withOpt bool) error {
	if err := t.wireMoE(); err != nil { // moe.go
		return err
	}
	if err := t.prepare(); err != nil {
		return err
	}
	t.materialize()
	if err := t.fillParams(fill); err != nil {
		return err
	}
	if withOpt && t.Opt == nil {
		t.Opt = BuildOptimizer(t.Cfg, t.Model.Params(), t.Alloc)
	}
	return nil
}

// Init is where a model's initial values come from: the weights file From
// (init_from) when set, else the seed's values (nn.GPTConfig.InitPart).
type Init struct {
	Seed int64
	From string
}

// initialFill opens init for filling parts of the model m; done closes
// what it opened. A weights file that does not fit m is refused here,
// before anything is allocated.
func initialFill(m nn.GPTConfig, init Init) (fill partFiller, done func(), err error) {
	if init.From == "" {
		return initialValues(m, init.Seed), func() {}, nil
	}
	w, err := openWeights(init.From, m)
	if err != nil {
		return nil, nil, err
	}
	// The file holds the base; LoRA adapters start from their initial values.
	return baseFrom(w.fill, initialValues(m, init.Seed)), func() { w.Close() }, nil
}

// CheckWeights refuses a weights file that would not load into the model
// m (LoadWeights' checks: the header against the model's names and
// shapes, every value finite), reading it part by part without keeping
// it: a caller that will fill the model from it later, part by part on
// each rank (Init.From), learns now that it would fail.
func CheckWeights(path string, m nn.GPTConfig, dtype tensor.DType) error {
	w, err := openWeights(path, m)
	if err != nil {
		return err
	}
	defer w.Close()
	for _, ps := range m.ParamShapes() {
		if nn.IsAdapter(ps.Name) {
			continue // adapters are not in a base's file
		}
		spec := place.NewSpec(ps.Name, ps.Shape)
		if err := w.verify(spec, place.Single, dtype); err != nil {
			return err
		}
	}
	return nil
}

// materialize gives storage to every parameter that has none and that no
// Holder keeps elsewhere: its local part, of the shape its placement left.
func (t *Trainer) materialize() {
	for _, p := range t.Model.Params() {
		if p.HasStorage() || t.heldByPlugin(p) {
			continue
		}
		p.Allocate()
	}
}

// heldByPlugin reports whether a Holder plugin keeps p's value.
func (t *Trainer) heldByPlugin(p *tensor.Tensor) bool {
	for _, pl := range t.Plugins {
		if hd, ok := pl.(Holder); ok {
			if _, ok := hd.Hold(t, p); ok {
				return true
			}
		}
	}
	return false
}

// partFiller writes the global elements of parameter spec.Name that the
// rank at c holds into data, laid out as spec says.
type partFiller func(spec *place.Spec, c place.Coord, data *tensor.Tensor) error

// fillParams writes every part of every parameter this rank holds.
func (t *Trainer) fillParams(fill partFiller) error {
	c := t.Coord()
	for _, p := range t.Model.Params() {
		h, err := t.Holding(p)
		if err != nil {
			return err
		}
		if h.Value.Data == nil {
			continue
		}
		if err := fill(h.Value.Spec, c, h.Value.Data); err != nil {
			return err
		}
	}
	return nil
}

// initialValues fills parts with the model's initial values under seed.
func initialValues(m nn.GPTConfig, seed int64) partFiller {
	return func(spec *place.Spec, c place.Coord, data *tensor.Tensor) error {
		m.InitPart(seed, spec, c, data)
		return nil
	}
}

// baseFrom fills a LoRA run's base from file and its adapters, which a
// base weights file does not hold, from their initial values (init).
func baseFrom(file, init partFiller) partFiller {
	return func(spec *place.Spec, c place.Coord, data *tensor.Tensor) error {
		if nn.IsAdapter(spec.Name) {
			return init(spec, c, data)
		}
		return file(spec, c, data)
	}
}

// weightsFile is a weights file (SaveWeights, or Hugging Face GPT-2's)
// opened for reading the parts of its tensors a rank holds.
type weightsFile struct {
	path string
	r    *ckpt.Reader
	key  map[string]string // parameter name -> the file's tensor name
}

// openWeights opens path and checks, from its header alone, that it holds
// every parameter of the model m with its shape and nothing else (a
// "transformer." prefix, the attention masks and the tied lm_head of
// Hugging Face files are accepted): a file that does not fit is refused
// before any parameter is allocated, naming every offender.
func openWeights(path string, m nn.GPTConfig) (*weightsFile, error) {
	r, err := ckpt.Open(path)
	if err != nil {
		return nil, fmt.Errorf("init_from: %w", err)
	}
	w := &weightsFile{path: path, r: r, key: map[string]string{}}
	infos := map[string]ckpt.Info{}
	own := map[string]bool{}
	for _, ps := range m.BaseShapes() {
		own[ps.Name] = true
	}
	for key, info := range r.Tensors() {
		name := strings.TrimPrefix(key, "transformer.")
		if skippedName(name) && !own[name] { // an untied Llama's lm_head is a parameter
			continue
		}
		infos[name] = info
		w.key[name] = key
	}
	var problems []string
	for _, ps := range m.BaseShapes() { // a LoRA run's adapters start fresh (lora.go)
		info, ok := infos[ps.Name]
		if !ok {
			problems = append(problems, fmt.Sprintf("missing %s %v", ps.Name, ps.Shape))
			continue
		}
		delete(infos, ps.Name)
		if !slices.Equal(info.Shape, ps.Shape) {
			problems = append(problems, fmt.Sprintf("%s has shape %v in the file but %v in the model", ps.Name, info.Shape, ps.Shape))
		}
	}
	var extra []string
	for name := range infos {
		extra = append(extra, name)
	}
	sort.Strings(extra)
	for _, name := range extra {
		problems = append(problems, "unknown tensor "+name)
	}
	if len(problems) > 0 {
		r.Close()
		return nil, fmt.Errorf("init_from %s does not fit the model (check model.* against the file): %s", path, strings.Join(problems, "; "))
	}
	return w, nil
}

func (w *weightsFile) Close() error { return w.r.Close() }

// fill reads, run by run, only the bytes of the elements the part holds,
// straight into its data, and refuses a non-finite value (naming its
// global element index).
func (w *weightsFile) fill(spec *place.Spec, c place.Coord, data *tensor.Tensor) error {
	key := w.key[spec.Name]
	var err error
	spec.Runs(c, func(g, l, n int) {
		if err != nil {
			return
		}
		if err = w.r.ReadRange(key, g, n, data, l); err != nil {
			err = fmt.Errorf("init_from: %w", err)
			return
		}
		if i, bad := firstNonFinite(data.Span(l, l+n)); bad {
			err = fmt.Errorf("init_from %s: tensor %s holds a non-finite value (element %d = %v)", w.path, spec.Name, g+i, data.At(l+i))
		}
	})
	return err
}

// verify reads the part as fill would, into scratch memory, so that a
// caller loading into live parameters refuses a bad file before it
// changes any of them. The scratch is one buffer of at most verifyChunk
// elements, reused run by run and chunk by chunk: checking a tensor of
// any size holds no copy of it outside the allocator.
func (w *weightsFile) verify(spec *place.Spec, c place.Coord, dtype tensor.DType) error {
	var err error
	var scratch *tensor.Tensor
	spec.Runs(c, func(g, l, n int) {
		for at := 0; at < n && err == nil; at += verifyChunk {
			k := min(n-at, verifyChunk)
			if scratch == nil || scratch.Numel() < k {
				if dtype == tensor.Float64 {
					scratch = tensor.FromF64(make([]float64, k), k)
				} else {
					scratch = tensor.FromF32(make([]float32, k), k)
				}
			}
			// The spec at the scratch's own run: global elements [g+at, g+at+k).
			one := place.NewSpec(spec.Name, []int{g + at + k})
			one.Along[place.DP] = place.Placement{Kind: place.Flat, Offset: g + at, Length: k}
			err = w.fill(one, place.Single, scratch.Span(0, k))
		}
	})
	return err
}

// verifyChunk is the most elements verify reads at once.
const verifyChunk = 1 << 16
