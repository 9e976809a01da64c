package ckpt

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/tinyacc/tinyacc/core/place"
)

// A training checkpoint is a directory step-NNNNNNN/ holding safetensors
// files written by the ranks that own each piece of the model and of the
// optimizer state, and index.json, which maps every global tensor to the
// files and slices that hold it and records each file's digest, the
// trainer's state and the resolved config. No rank ever holds the whole
// model to write or read one; any layout can read any checkpoint.

// IndexFile is the name of a checkpoint's index.
const IndexFile = "index.json"

// IndexFormat and IndexVersion identify the index layout.
const (
	IndexFormat  = "tinyacc-checkpoint"
	IndexVersion = 1
)

// Index describes one checkpoint.
type Index struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
	// Step is the number of optimizer steps completed.
	Step int `json:"step"`
	// Files are the checkpoint's data files, by name, with their digests.
	Files map[string]FileInfo `json:"files"`
	// Tensors are the model's global parameters, by Hugging Face name.
	Tensors map[string]*TensorInfo `json:"tensors"`
	// Trainer is what the loop needs to continue exactly.
	Trainer TrainerState `json:"trainer"`
	// Config is the resolved configuration of the run, key -> value.
	Config map[string]any `json:"config"`
	// LoRABase is the SHA-256 of the frozen base a LoRA run's adapters
	// were trained on; Tensors then hold only what trains.
	LoRABase string `json:"lora_base_sha256,omitempty"`
}

// FileInfo is one data file of a checkpoint.
type FileInfo struct {
	SHA256 string `json:"sha256"`
	Bytes  int64  `json:"bytes"`
}

// TensorInfo is one global parameter: its shape and dtype, where the
// pieces of its value are, and where the pieces of each optimizer buffer
// are (state kind -> pieces), with the parameter's step count and weight
// decay.
type TensorInfo struct {
	Shape       []int             `json:"shape"`
	DType       string            `json:"dtype"`
	Parts       []Part            `json:"parts"`
	State       map[string][]Part `json:"state,omitempty"`
	Steps       int               `json:"steps"`
	WeightDecay float64           `json:"weight_decay"`
}

// Part is one piece of a global tensor: the elements the rank at Coord
// held under Spec (place.Spec.Runs gives them, in order), stored as the
// 1-D tensor Key of File.
type Part struct {
	File  string      `json:"file"`
	Key   string      `json:"key"`
	Spec  *place.Spec `json:"spec"`
	Coord place.Coord `json:"coord"`
}

// TrainerState is what the loop needs besides weights and optimizer state
// to continue exactly as the uninterrupted run would have.
type TrainerState struct {
	Step int `json:"step"` // optimizer steps completed
	// ScheduleStep is the learning-rate schedule's position (the next
	// step's index into it).
	ScheduleStep int   `json:"schedule_step"`
	Seed         int64 `json:"seed"`
	// DataOrder and the per-data-parallel-rank positions: the index of the
	// next global sample each data-parallel rank reads. Batches are a pure
	// function of (seed, step, rank), so these follow from Step; they are
	// recorded to check a resumed run reads what the original would have.
	DataOrder     string  `json:"data_order"`
	DataPositions []int64 `json:"data_positions"`
	GlobalBatch   int     `json:"global_batch"`
	// Layout is the run's layout, for information (any layout may resume).
	Layout map[string]int `json:"layout"`
	// LossScale and LossScaleGood are fp16's loss scale and the good steps
	// in a row since it last changed; absent without loss scaling.
	LossScale     float64 `json:"loss_scale,omitempty"`
	LossScaleGood int     `json:"loss_scale_good_steps,omitempty"`
}

// StepDir is the directory name of the checkpoint after step steps.
func StepDir(step int) string { return fmt.Sprintf("step-%07d", step) }

// ParseStepDir returns the step of a checkpoint directory name, as StepDir
// writes it ("step-" and at least seven digits), and whether name is one.
func ParseStepDir(name string) (int, bool) {
	digits, ok := strings.CutPrefix(name, "step-")
	if !ok || len(digits) < 7 || len(digits) > 18 {
		return 0, false
	}
	n := 0
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, StepDir(n) == name
}

// LatestFile names the pointer to the newest complete checkpoint.
const LatestFile = "latest"

// ReadIndex reads a checkpoint's index and checks every value in it for
// range and consistency (check).
func ReadIndex(dir string) (*Index, error) {
	b, err := os.ReadFile(filepath.Join(dir, IndexFile))
	if err != nil {
		return nil, fmt.Errorf("ckpt: %s is not a checkpoint (no readable %s): %w", dir, IndexFile, err)
	}
	var ix Index
	if err := json.Unmarshal(b, &ix); err != nil {
		return nil, fmt.Errorf("ckpt: %s: %w", filepath.Join(dir, IndexFile), err)
	}
	if ix.Format != IndexFormat || ix.Version != IndexVersion {
		return nil, fmt.Errorf("ckpt: %s: format %q version %d; this build reads %q version %d", filepath.Join(dir, IndexFile), ix.Format, ix.Version, IndexFormat, IndexVersion)
	}
	if err := ix.check(dir); err != nil {
		return nil, err
	}
	return &ix, nil
}

func flatten(m map[string][]Part) []Part {
	var out []Part
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		out = append(out, m[k]...)
	}
	return out
}

// ErrNoCheckpoint is what Resolve returns, wrapped, for a directory that
// holds neither a checkpoint nor a latest pointer: nothing was saved there
// yet.
var ErrNoCheckpoint = errors.New("no checkpoint")

// Resolve turns a resume path into a checkpoint directory: a checkpoint
// itself, or a checkpoint root whose latest pointer names one. The pointer
// may only name a step directory of that root, so a damaged or edited
// pointer never resumes a run from another directory.
func Resolve(path string) (string, error) {
	if _, err := os.Stat(filepath.Join(path, IndexFile)); err == nil {
		return path, nil
	}
	latest := filepath.Join(path, LatestFile)
	b, err := os.ReadFile(latest)
	if os.IsNotExist(err) {
		return "", fmt.Errorf("ckpt: %s is neither a checkpoint (no %s) nor a checkpoint directory with a %q pointer: %w", path, IndexFile, LatestFile, ErrNoCheckpoint)
	}
	if err != nil {
		return "", fmt.Errorf("ckpt: %w", err)
	}
	name := strings.TrimSpace(string(b))
	if _, ok := ParseStepDir(name); !ok {
		return "", fmt.Errorf("ckpt: %s holds %s, not the name of a checkpoint of %s (like %s); write the name of one of its step directories into it, or remove it to start afresh",
			latest, quoteCut(string(b), 64), path, StepDir(0))
	}
	dir := filepath.Join(path, name)
	if _, err := os.Stat(filepath.Join(dir, IndexFile)); err != nil {
		return "", fmt.Errorf("ckpt: %s points at %s, which is not a complete checkpoint", latest, dir)
	}
	return dir, nil
}

// quoteCut quotes s for an error message, escaping what is not printable,
// cut to at most n bytes of s.
func quoteCut(s string, n int) string {
	if len(s) <= n {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(strings.ToValidUTF8(s[:n], "")), len(s))
}

// Digest returns the SHA-256 of a file, hex, and its size.
func Digest(path string) (FileInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return FileInfo{}, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return FileInfo{}, err
	}
	return FileInfo{SHA256: hex.EncodeToString(h.Sum(nil)), Bytes: n}, nil
}

// Verify checks every file of the checkpoint against its digest, naming
// the first file that differs.
func (ix *Index) Verify(dir string) error {
	names := make([]string, 0, len(ix.Files))
	for n := range ix.Files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		got, err := Digest(filepath.Join(dir, n))
		if err != nil {
			return fmt.Errorf("ckpt: %s (%s): %w", filepath.Join(dir, n), ix.holders(n), err)
		}
		if want := ix.Files[n]; got != want {
			return fmt.Errorf("ckpt: %s (%s) does not match its digest in %s (%d bytes, sha256 %s; the index says %d bytes, %s): the file is damaged",
				filepath.Join(dir, n), ix.holders(n), IndexFile, got.Bytes, got.SHA256[:12], want.Bytes, want.SHA256[:12])
		}
	}
	return nil
}

// holders names the tensors with a piece in file, for error messages.
func (ix *Index) holders(file string) string {
	var names []string
	for name, ti := range ix.Tensors {
		for _, p := range append(append([]Part(nil), ti.Parts...), flatten(ti.State)...) {
			if p.File == file {
				names = append(names, name)
				break
			}
		}
	}
	sort.Strings(names)
	switch {
	case len(names) == 0:
		return "no tensor"
	case len(names) > 3:
		return fmt.Sprintf("pieces of %s and %d more tensors", strings.Join(names[:3], ", "), len(names)-3)
	}
	return "pieces of " + strings.Join(names, ", ")
}
