package config

import (
	"fmt"
	"strconv"
	"strings"
)

// validatePP checks the pipeline keys: a schedule by name, chunks a
// layer each at least, micro-batches the interleaved schedule can group,
// an explicit split that covers the model, and no ZeRO stage that reduces
// gradients during backward.
func (c *Config) validatePP(v *validator) {
	pl, pp := c.Parallel.PP, &c.PP
	if pl < 1 {
		v.addf("config: parallel.pp=%d must be >= 1", pl)
	}
	v.oneOf("pp.schedule", pp.Schedule, "afab", "1f1b", "interleaved", "zb1")
	v.positive("pp.virtual_stages", int64(pp.VirtualStages))
	if pp.VirtualStages > 1 && pp.Schedule != "interleaved" {
		v.addf("config: pp.virtual_stages=%d needs pp.schedule=interleaved (pp.schedule=%s runs one chunk per rank): set pp.virtual_stages=1 or pp.schedule=interleaved", pp.VirtualStages, pp.Schedule)
	}
	if pl <= 1 || pp.VirtualStages < 1 {
		return
	}
	chunks := pl * pp.VirtualStages
	if chunks > c.Model.NLayer {
		v.addf("config: parallel.pp=%d × pp.virtual_stages=%d = %d model chunks, but model.n_layer=%d: every chunk needs at least one block; lower parallel.pp or pp.virtual_stages",
			pl, pp.VirtualStages, chunks, c.Model.NLayer)
	}
	if pp.Schedule == "interleaved" && c.Train.GradAccum > 0 && c.Train.GradAccum%pl != 0 {
		v.addf("config: pp.schedule=interleaved needs train.grad_accum=%d (the micro-batches of a step) to be a multiple of parallel.pp=%d", c.Train.GradAccum, pl)
	}
	if c.Zero.Stage >= 2 {
		v.addf("config: zero.stage=%d with parallel.pp=%d: ZeRO-2 and ZeRO-3 reduce gradients inside every micro-batch's backward, but a pipeline sums the tied embedding's gradient over its first and last stage once per step, before any reduction; use zero.stage=1 (or 0) with pipeline parallel",
			c.Zero.Stage, pl)
	}
	if pp.Layers != "" {
		if _, err := c.PPLayers(); err != nil {
			v.errs = append(v.errs, err)
		}
	}
}

// PPLayers parses pp.layers: the number of blocks of each model chunk, in
// model order (parallel.pp × pp.virtual_stages positive counts summing to
// model.n_layer). It returns nil when pp.layers is empty (balance by
// compute).
func (c Config) PPLayers() ([]int, error) {
	if c.PP.Layers == "" {
		return nil, nil
	}
	var out []int
	sum := 0
	for _, f := range strings.Split(c.PP.Layers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("config: pp.layers=%q: want positive block counts separated by commas, such as 3,3,2", c.PP.Layers)
		}
		out = append(out, n)
		sum += n
	}
	chunks := c.Parallel.PP * c.PP.VirtualStages
	if len(out) != chunks || sum != c.Model.NLayer {
		return nil, fmt.Errorf("config: pp.layers=%q gives %d chunks and %d blocks; want parallel.pp × pp.virtual_stages = %d chunks and model.n_layer = %d blocks",
			c.PP.Layers, len(out), sum, chunks, c.Model.NLayer)
	}
	return out, nil
}
