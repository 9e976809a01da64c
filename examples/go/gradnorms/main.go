// Command gradnorms shows how a Go program composes tinyacc's trainer with a
// plugin of its own: LayerNorms records the gradient norm of every
// transformer block after each backward (the PostGrad hook) and prints them
// every few steps, the kind of probe one writes to find a layer that
// explodes or dies.
//
//	go run ./examples/go/gradnorms --train.steps=20
package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"strings"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/core/tensor/cpu"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// LayerNorms is a trainer plugin: it implements trainer.Plugin and the
// trainer.PostGrader hook, nothing else.
type LayerNorms struct {
	// Norms[step][i] is the gradient norm of group i (see Groups) after
	// the last micro-batch of the step.
	Norms  [][]float64
	Groups []string
	step   int
}

// Name implements trainer.Plugin.
func (p *LayerNorms) Name() string { return "layer-norms" }

// PostGrad implements trainer.PostGrader: after the last micro-batch the
// gradients are complete for the step; group them by module.
func (p *LayerNorms) PostGrad(t *trainer.Trainer, info tensor.PassInfo) error {
	if !info.Last {
		return nil
	}
	var row []float64
	var names []string
	for _, m := range t.Model.Modules() {
		var ss float64
		for _, prm := range m.Params() {
			ss += cpu.SumSquares(prm.Grad.F32())
		}
		names = append(names, m.Name())
		row = append(row, math.Sqrt(ss))
	}
	p.Groups = names
	p.Norms = append(p.Norms, row)
	p.step++
	return nil
}

// run trains with the probe and returns it with every step's metrics.
func run(args []string, out io.Writer) (*LayerNorms, []trainer.StepMetrics, error) {
	r, err := config.Load("", nil, append([]string{"--train.steps=20", "--model.n_layer=2", "--model.n_embd=64", "--model.block_size=64", "--train.eval_every=0"}, args...))
	if err != nil {
		return nil, nil, err
	}
	probe := &LayerNorms{}
	var steps []trainer.StepMetrics
	t, err := trainer.New(r.Config, trainer.Options{Plugins: []trainer.Plugin{probe}, Log: io.Discard,
		OnStep: func(m trainer.StepMetrics) { steps = append(steps, m) }})
	if err != nil {
		return nil, nil, err
	}
	if _, err := t.Run(context.Background()); err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(out, "%-6s %s\n", "step", strings.Join(probe.Groups, "  "))
	for s, row := range probe.Norms {
		fmt.Fprintf(out, "%-6d", s+1)
		for _, v := range row {
			fmt.Fprintf(out, " %8.4f", v)
		}
		fmt.Fprintf(out, "   loss %.4f\n", steps[s].Loss)
	}
	return probe, steps, nil
}

func main() {
	if _, _, err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "gradnorms:", err)
		os.Exit(1)
	}
}
