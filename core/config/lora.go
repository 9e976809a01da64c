package config

import (
	"slices"
	"strings"
)

// LoRA fine-tuning (docs/lora.md): with lora.rank above 0 the base
// weights are frozen and each linear layer lora.targets names gains a
// low-rank adapter B·A scaled by lora.alpha/lora.rank. The targets are
// module names matched as Hugging Face PEFT matches target_modules: a
// module is targeted when its name equals a target or ends with "." and
// the target ("c_proj" names both of GPT-2's projections, "attn.c_proj"
// the attention's only). A target that matches no module is an error
// listing the modules there are.

// LoRAModules are the linear layers an architecture can carry adapters
// on, by their names inside a block.
func LoRAModules(arch string) []string {
	if arch == "llama" {
		return []string{"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
			"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}
	}
	return []string{"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}
}

// DefaultLoRATargets are the attention projections adapters go on by
// default: GPT-2's fused c_attn, a Llama's q_proj and v_proj (PEFT's
// defaults for these model classes).
func DefaultLoRATargets(arch string) []string {
	if arch == "llama" {
		return []string{"q_proj", "v_proj"}
	}
	return []string{"c_attn"}
}

// LoRATargeted reports whether module (a name from LoRAModules) is named
// by one of targets.
func LoRATargeted(module string, targets []string) bool {
	for _, t := range targets {
		if module == t || strings.HasSuffix(module, "."+t) {
			return true
		}
	}
	return false
}

// resolveLoRATargets gives lora.targets the default of the architecture
// when no layer set it (origin "default"): the built-in default is
// GPT-2's, and a Llama's attention has no c_attn.
func (c *Config) resolveLoRATargets(origin string) {
	if origin == "default" || origin == "" {
		c.LoRA.Targets = DefaultLoRATargets(c.Model.Arch)
	}
}

// validateLoRA checks the lora.* keys; the targets matter only when
// lora.rank is above 0.
func (c *Config) validateLoRA(v *validator) {
	l := &c.LoRA
	v.nonNegative("lora.rank", int64(l.Rank))
	if !(l.Alpha > 0) {
		v.addf("config: lora.alpha=%s must be > 0: the update is scaled by alpha/rank; use a value such as 16", ff(l.Alpha))
	}
	if !(l.Dropout >= 0 && l.Dropout < 1) {
		v.addf("config: lora.dropout=%s must be in [0, 1): use 0 for no dropout", ff(l.Dropout))
	}
	v.oneOf("lora.train_biases", l.TrainBiases, "none", "all")
	if l.Rank <= 0 {
		return
	}
	mods := LoRAModules(c.Model.Arch)
	if len(l.Targets) == 0 {
		v.addf("config: lora.rank=%d with lora.targets=[] trains nothing: name any of %s", l.Rank, strings.Join(mods, ", "))
	}
	for _, t := range l.Targets {
		if !slices.ContainsFunc(mods, func(m string) bool { return LoRATargeted(m, []string{t}) }) {
			v.addf("config: lora.targets=[%s] names %q, which is no module of model.arch=%s: use any of %s (or their last part, as c_attn or q_proj)",
				strings.Join(l.Targets, ","), t, c.Model.Arch, strings.Join(mods, ", "))
		}
	}
	if c.Model.MoE.Experts > 0 {
		v.addf("config: lora.rank=%d with model.moe.experts=%d: adapters on mixture-of-experts blocks are not available in this build; set model.moe.experts=0 or lora.rank=0", l.Rank, c.Model.MoE.Experts)
	}
	if c.DDP.Process || len(c.Plugins.Process) > 0 {
		v.addf("config: lora.rank=%d with plugin processes (ddp.process, plugins.process): a plugin process would move the frozen base's gradients too; run the plugins in-process", l.Rank)
	}
}

// LoRAScale is alpha/rank, the factor of the adapters' update.
func (c *Config) LoRAScale() float64 { return c.LoRA.Alpha / float64(c.LoRA.Rank) }
