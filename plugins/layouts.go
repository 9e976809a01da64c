package plugins

import (
	"fmt"
	"strconv"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/plugins/pp"
)

// A Dim is one choice a layout makes: the values it can take once the
// dims before it are chosen (c holds those choices), and how a value is
// set. Values returns no values when the dim does not apply to c (the
// key keeps the run's value and no flag is written), or an error when no
// value can work, which refuses the partial layout with it. Adding a
// dimension to the search (a new parallel axis, a new key) is adding one
// Dim to a list; Layouts knows none of them.
type Dim struct {
	Key    string
	Values func(c config.Config, world int) ([]string, error)
	// Set applies v to c on world ranks and returns the flags
	// (key=value) it wrote.
	Set func(c *config.Config, world int, v string) []string
}

// Layout is one point of the search: the run's config with every dim
// chosen, the flags (key=value, in dim order) that choose them, and the
// error of a dim that could not be chosen (nil otherwise).
type Layout struct {
	Config config.Config
	Flags  []string
	Err    error
}

// Layouts enumerates every combination of dims for a run of cfg on world
// ranks, depth first in the order of dims (the first dim varies slowest).
// A dim's error ends its branch as one refused layout.
func Layouts(cfg config.Config, world int, dims []Dim) []Layout {
	var out []Layout
	var walk func(c config.Config, flags []string, i int)
	walk = func(c config.Config, flags []string, i int) {
		if i == len(dims) {
			out = append(out, Layout{Config: c, Flags: flags})
			return
		}
		vs, err := dims[i].Values(c, world)
		if err != nil {
			out = append(out, Layout{Config: c, Flags: flags, Err: err})
			return
		}
		if len(vs) == 0 {
			walk(c, flags, i+1)
			return
		}
		for _, v := range vs {
			n := c
			f := dims[i].Set(&n, world, v)
			walk(n, append(append([]string(nil), flags...), f...), i+1)
		}
	}
	walk(cfg, nil, 0)
	return out
}

// intDim is a dim of one integer key: get and set reach its field.
func intDim(key string, values func(c config.Config, world int) ([]int, error), set func(c *config.Config, v int)) Dim {
	return Dim{
		Key: key,
		Values: func(c config.Config, world int) ([]string, error) {
			vs, err := values(c, world)
			var out []string
			for _, v := range vs {
				out = append(out, strconv.Itoa(v))
			}
			return out, err
		},
		Set: func(c *config.Config, world int, v string) []string {
			n, _ := strconv.Atoi(v)
			set(c, n)
			return []string{key + "=" + v}
		},
	}
}

// stringDim is a dim of one string key.
func stringDim(key string, values func(c config.Config, world int) []string, set func(c *config.Config, v string)) Dim {
	return Dim{
		Key:    key,
		Values: func(c config.Config, world int) ([]string, error) { return values(c, world), nil },
		Set: func(c *config.Config, world int, v string) []string {
			set(c, v)
			return []string{key + "=" + v}
		},
	}
}

// dpOf is the data-parallel size of c's layout on world ranks.
func dpOf(c config.Config, world int) int {
	return world / max(1, c.Parallel.TP*c.Parallel.PP*c.Parallel.CP)
}

// MeshDims split the ranks into tp × pp × cp × dp, expert parallel over
// dp × cp where the model has experts, and each ZeRO stage where dp > 1:
// the layouts Fits names. parallel.dp is written only when
// the run sets it (0 means "every rank left").
func MeshDims() []Dim {
	return []Dim{
		intDim("parallel.tp", func(_ config.Config, world int) ([]int, error) { return divisors(world), nil },
			func(c *config.Config, v int) { c.Parallel.TP = v }),
		intDim("parallel.pp", func(c config.Config, world int) ([]int, error) { return divisors(world / c.Parallel.TP), nil },
			func(c *config.Config, v int) { c.Parallel.PP = v }),
		intDim("parallel.cp", func(c config.Config, world int) ([]int, error) {
			return divisors(world / (c.Parallel.TP * c.Parallel.PP)), nil
		}, func(c *config.Config, v int) { c.Parallel.CP = v }),
		intDim("parallel.dp", func(c config.Config, world int) ([]int, error) {
			if c.Parallel.DP == 0 {
				return nil, nil
			}
			return []int{dpOf(c, world)}, nil
		}, func(c *config.Config, v int) { c.Parallel.DP = v }),
		intDim("parallel.ep", func(c config.Config, world int) ([]int, error) {
			// Expert parallel splits a mixture of experts' experts over
			// groups of the dp × cp ranks; a dense model has no such axis.
			if c.Model.MoE.Experts == 0 {
				return nil, nil
			}
			var out []int
			for _, e := range divisors(dpOf(c, world) * c.Parallel.CP) {
				if c.Model.MoE.Experts%e == 0 {
					out = append(out, e)
				}
			}
			return out, nil
		}, func(c *config.Config, v int) { c.Parallel.EP = v }),
		intDim("zero.stage", func(c config.Config, world int) ([]int, error) {
			if dpOf(c, world) == 1 {
				return []int{0}, nil
			}
			return []int{0, 1, 2, 3}, nil
		}, func(c *config.Config, v int) { c.Zero.Stage = v }),
	}
}

// PlanDims are MeshDims and what a layout chooses beyond the mesh: the
// pipeline schedule and its virtual stages where pp > 1, the micro-batch
// count (train.grad_accum, with train.batch_size so that their product ×
// dp is the global batch of global sequences), and the recomputation
// granularity. Mixed precision is the run's choice, never searched. A
// new axis is one more Dim whose Values return none where it does not
// apply, as parallel.ep does for a dense model.
func PlanDims(global int) []Dim {
	return append(MeshDims(),
		stringDim("pp.schedule", func(c config.Config, _ int) []string {
			if c.Parallel.PP == 1 {
				return nil
			}
			return pp.Schedules
		}, func(c *config.Config, v string) { c.PP.Schedule = v }),
		intDim("pp.virtual_stages", func(c config.Config, _ int) ([]int, error) {
			if c.Parallel.PP == 1 || c.PP.Schedule != pp.Interleaved {
				if c.Parallel.PP > 1 && c.PP.VirtualStages != 1 {
					return []int{1}, nil // a run's interleaved v, reset for the other schedules
				}
				return nil, nil
			}
			var vs []int
			for v := 2; v <= 4 && c.Parallel.PP*v <= c.Model.NLayer; v *= 2 {
				vs = append(vs, v)
			}
			if len(vs) == 0 {
				return nil, fmt.Errorf("pp: the interleaved schedule needs 2 model chunks per rank, but model.n_layer=%d has fewer than 2 × parallel.pp=%d blocks", c.Model.NLayer, c.Parallel.PP)
			}
			return vs, nil
		}, func(c *config.Config, v int) { c.PP.VirtualStages = v }),
		MicroDim(global),
		stringDim("recompute.granularity", func(config.Config, int) []string { return []string{"none", "selective", "full"} },
			func(c *config.Config, v string) { c.Recompute.Granularity = v }),
	)
}

// MicroDim chooses train.grad_accum among the divisors of the sequences
// each data-parallel replica gets of the global batch, and sets
// train.batch_size to the rest: batch_size × grad_accum × dp = global.
func MicroDim(global int) Dim {
	return Dim{
		Key: "train.grad_accum",
		Values: func(c config.Config, world int) ([]string, error) {
			dp := dpOf(c, world)
			if global%dp != 0 {
				return nil, fmt.Errorf("the global batch of %d sequences (train.batch_size × train.grad_accum) does not split over dp=%d ranks", global, dp)
			}
			var out []string
			for _, m := range divisors(global / dp) {
				out = append(out, strconv.Itoa(m))
			}
			return out, nil
		},
		Set: func(c *config.Config, world int, v string) []string {
			m, _ := strconv.Atoi(v)
			c.Train.GradAccum = m
			c.Train.BatchSize = global / (dpOf(*c, world) * m)
			return []string{"train.batch_size=" + strconv.Itoa(c.Train.BatchSize), "train.grad_accum=" + v}
		},
	}
}
