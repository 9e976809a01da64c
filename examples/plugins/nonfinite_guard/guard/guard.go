// Package guard is a plugin that keeps steps whose gradients are not
// finite (or, optionally, too large) out of training: before the optimizer
// step it checks every gradient (after data parallel has averaged them),
// and when one is bad it zeroes all of them for that step and logs the
// largest per-layer gradient norms. The same value runs compiled into a program
// (trainer.Options.Plugins) or as a plugin process (this directory's
// main.go, through plugins.process); both change training identically.
//
// Zeroed gradients still let AdamW apply weight decay and its running
// moments for that step; what never reaches the weights is the bad
// gradient itself.
package guard

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// Name is the plugin's name and the section of its keys; it is not the
// core trainer's train.* section, so the two never collide.
const Name = "nonfinite_guard"

// Keys are the configuration keys the guard declares, with their defaults.
var Keys = []config.Declared{
	{Key: Name + ".max_skips", Type: "int", Default: "3", Plugin: Name},
	{Key: Name + ".max_norm", Type: "float", Default: "0", Plugin: Name},
}

// Guard is the plugin. It implements trainer.PreStepper and
// trainer.PostStepper.
type Guard struct {
	// MaxSkips ends the run after this many bad steps in a row.
	MaxSkips int
	// MaxNorm also treats a step whose global gradient norm exceeds it as
	// bad; 0 checks finiteness only.
	MaxNorm float64
	// Log receives one line per skipped step.
	Log io.Writer

	done    int // steps completed, as the trainer counts them
	inRow   int
	Skipped int // steps skipped so far
}

// shown is how many of the largest per-layer norms a skipped step's line
// names: enough to see where a spike comes from, short enough to read.
const shown = 3

// Name implements trainer.Plugin.
func (g *Guard) Name() string { return Name }

// PostStep implements trainer.PostStepper: it learns the number of the
// step just completed, so the guard numbers steps as the trainer's
// progress line and errors do (from 1; after a resume, from the end of
// its first step).
func (g *Guard) PostStep(t *trainer.Trainer, m *trainer.StepMetrics) error {
	g.done = m.Step
	return nil
}

// layerNorm is one parameter's gradient norm.
type layerNorm struct {
	name string
	norm float64
}

// PreStep zeroes the step's gradients when one is not finite or their norm
// exceeds MaxNorm.
func (g *Guard) PreStep(t *trainer.Trainer) error {
	step := g.done + 1
	var total float64
	var layers []layerNorm
	bad := ""
	for _, p := range t.Model.Params() {
		if p.Grad == nil {
			continue
		}
		var sum float64
		for _, v := range p.Grad.F32() {
			sum += float64(v) * float64(v)
		}
		if bad == "" && (math.IsNaN(sum) || math.IsInf(sum, 0)) {
			bad = "the gradient of " + p.Name + " is not finite"
		}
		total += sum
		layers = append(layers, layerNorm{p.Name, math.Sqrt(sum)})
	}
	if norm := math.Sqrt(total); bad == "" && g.MaxNorm > 0 && norm > g.MaxNorm {
		bad = fmt.Sprintf("the gradient norm %.4g exceeds %s.max_norm=%g", norm, Name, g.MaxNorm)
	}
	if bad == "" {
		g.inRow = 0
		return nil
	}
	g.inRow++
	g.Skipped++
	if g.Log != nil {
		fmt.Fprintf(g.Log, "%s: step %d skipped: %s; largest layer norms: %s\n", Name, step, bad, largest(layers, shown))
	}
	if g.MaxSkips > 0 && g.inRow > g.MaxSkips {
		return fmt.Errorf("%s: %d steps in a row had bad gradients, the last step %d (%s.max_skips=%d): %s", Name, g.inRow, step, Name, g.MaxSkips, bad)
	}
	for _, p := range t.Model.Params() {
		if p.Grad != nil {
			p.Grad.Zero()
		}
	}
	return nil
}

// largest names the n layers with the largest gradient norms, a non-finite
// one first.
func largest(layers []layerNorm, n int) string {
	sort.SliceStable(layers, func(i, j int) bool {
		a, b := layers[i].norm, layers[j].norm
		if math.IsNaN(a) || math.IsNaN(b) {
			return math.IsNaN(a) && !math.IsNaN(b)
		}
		return a > b
	})
	var parts []string
	for _, l := range layers[:min(n, len(layers))] {
		parts = append(parts, fmt.Sprintf("%s=%.4g", l.name, l.norm))
	}
	return strings.Join(parts, " ")
}
