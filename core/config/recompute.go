package config

import (
	"slices"
	"strings"
)

// RecomputeModules are the activations recompute.modules may name, in the
// order of a block's forward.
var RecomputeModules = []string{"norm", "mlp_act", "attn_core"}

// validateRecompute checks the recompute.* keys.
func (c *Config) validateRecompute(v *validator) {
	r := &c.Recompute
	v.oneOf("recompute.granularity", r.Granularity, "none", "selective", "full")
	seen := map[string]bool{}
	for _, m := range r.Modules {
		if !slices.Contains(RecomputeModules, m) {
			v.addf("config: recompute.modules=[%s] names %q: use any of %s", strings.Join(r.Modules, ","), m, strings.Join(RecomputeModules, ", "))
		} else if seen[m] {
			v.addf("config: recompute.modules=[%s] names %q twice: name each once", strings.Join(r.Modules, ","), m)
		}
		seen[m] = true
	}
	if r.Granularity == "selective" && len(r.Modules) == 0 {
		v.addf("config: recompute.granularity=selective with recompute.modules=[] drops nothing: name any of %s, or set recompute.granularity=none", strings.Join(RecomputeModules, ", "))
	}
	v.nonNegative("recompute.blocks", int64(r.Blocks))
	if n := c.Model.NLayer; r.Blocks > n && n > 0 {
		v.addf("config: recompute.blocks=%d exceeds model.n_layer=%d: give at most the number of blocks, or 0 for all", r.Blocks, n)
	}
}
