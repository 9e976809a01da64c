package trainer

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// The files of a LoRA run (docs/lora.md). Under lora.rank > 0 the base is
// frozen and comes from init_from, so save_to and checkpoints hold what
// training changes: the adapters (and the biases under
// lora.train_biases=all), checkpoints with their optimizer state, plus
// the SHA-256 of the base they were trained on. A resume against another
// base is refused, and `tinyacc export --lora` and `--merge-lora` read
// the base back through that digest.

// BaseDigest is the SHA-256 that names the base of a LoRA run of cfg: of
// init_from's bytes, or, for a fresh random base (tests), of a line
// naming its seed and model shape, which determine every weight.
func BaseDigest(cfg config.Config) (string, error) {
	h := sha256.New()
	if cfg.InitFrom == "" {
		m := GPTConfig(cfg)
		m.LoRA = nil
		fmt.Fprintf(h, "tinyacc fresh base: seed=%d model=%+v", cfg.Train.Seed, m)
		if m.Llama != nil {
			fmt.Fprintf(h, " llama=%+v", *m.Llama)
		}
		return hex.EncodeToString(h.Sum(nil)), nil
	}
	f, err := os.Open(cfg.InitFrom)
	if err != nil {
		return "", fmt.Errorf("init_from: %w", err)
	}
	defer f.Close()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("init_from %s: %w", cfg.InitFrom, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// loraBase is BaseDigest of the run, computed once; "" without LoRA.
func (t *Trainer) loraBase() (string, error) {
	if t.Cfg.LoRA.Rank == 0 {
		return "", nil
	}
	if t.baseDigest == "" {
		d, err := BaseDigest(t.Cfg)
		if err != nil {
			return "", err
		}
		t.baseDigest = d
	}
	return t.baseDigest, nil
}

// kept reports whether p belongs in save_to and checkpoints: every
// parameter, but under LoRA only those that train (the base is init_from).
func kept(p *tensor.Tensor) bool { return p.NeedsGrad() }

// LoRA metadata keys of an adapter file (save_to under LoRA).
const (
	MetaLoRABase    = "lora_base_sha256"
	MetaLoRARank    = "lora_rank"
	MetaLoRAAlpha   = "lora_alpha"
	MetaLoRATargets = "lora_targets"
	MetaLoRABiases  = "lora_train_biases"
)

// loraMeta adds the adapters' description to a weights file's metadata.
func loraMeta(meta map[string]string, cfg config.Config, base string) {
	meta[MetaLoRABase] = base
	meta[MetaLoRARank] = strconv.Itoa(cfg.LoRA.Rank)
	meta[MetaLoRAAlpha] = strconv.FormatFloat(cfg.LoRA.Alpha, 'g', -1, 64)
	meta[MetaLoRATargets] = strings.Join(cfg.LoRA.Targets, ",")
	meta[MetaLoRABiases] = cfg.LoRA.TrainBiases
}

// LoRAOf reads the LoRA shape an adapter file's metadata records (ok
// false for a file of whole weights).
func LoRAOf(meta map[string]string) (l *nn.LoRAShape, base string, ok bool, err error) {
	base, ok = meta[MetaLoRABase]
	if !ok {
		return nil, "", false, nil
	}
	r, err1 := strconv.Atoi(meta[MetaLoRARank])
	a, err2 := strconv.ParseFloat(meta[MetaLoRAAlpha], 64)
	if err1 != nil || err2 != nil || r < 1 {
		return nil, "", true, fmt.Errorf("adapter metadata %s=%q %s=%q is not a rank and an alpha", MetaLoRARank, meta[MetaLoRARank], MetaLoRAAlpha, meta[MetaLoRAAlpha])
	}
	return &nn.LoRAShape{Rank: r, Alpha: a, Targets: strings.Split(meta[MetaLoRATargets], ","), TrainBiases: meta[MetaLoRABiases] == "all"}, base, true, nil
}

// loraText describes a model's adapters for messages.
func loraText(l *nn.LoRAShape) string {
	if l == nil {
		return "no adapters"
	}
	return fmt.Sprintf("adapters of rank %d on %s", l.Rank, strings.Join(l.Targets, ", "))
}
