package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/tinyacc/tinyacc/core/trace"
	"github.com/tinyacc/tinyacc/plugins/pp"
)

func cmdPP(args []string, stdout io.Writer) error {
	if len(args) == 0 || args[0] != "draw" {
		return errors.New("usage: tinyacc pp draw --pp N --micro M [--schedule afab|1f1b|interleaved|zb1] [--virtual V] [--svg FILE] | --trace FILE [--step S]")
	}
	return ppDraw(args[1:], stdout)
}

// ppDraw prints a pipeline schedule as a timeline, played by the checker
// with unit costs, or a traced run's step, and its bubble beside the
// formula.
func ppDraw(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("pp draw", flag.ContinueOnError)
	p := fs.Int("pp", 4, "pipeline stages")
	m := fs.Int("micro", 8, "micro-batches per step")
	name := fs.String("schedule", pp.OneFOneB, "afab, 1f1b, interleaved or zb1")
	v := fs.Int("virtual", 1, "model chunks per rank (interleaved)")
	svg := fs.String("svg", "", "also write the timeline as an SVG picture")
	tracePath := fs.String("trace", "", "draw a run's measured step from its trace (the --trace of tinyacc train)")
	step := fs.Int("step", -1, "the traced step to draw (default: the last)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var sim *pp.Sim
	unit := 1.0
	if *tracePath != "" {
		tr, err := tracedStep(*tracePath, *step)
		if err != nil {
			return err
		}
		sim, unit, *name, *p, *v, *m = tr.Sim, tr.Unit, tr.Schedule, tr.P, tr.V, tr.M
	} else {
		s, err := pp.Generate(*name, *p, *v, *m)
		if err != nil {
			return err
		}
		if sim, err = s.Simulate(pp.Unit); err != nil {
			return err
		}
	}
	if err := pp.Draw(stdout, sim, *p, *v, unit); err != nil {
		return err
	}
	if *tracePath != "" {
		fmt.Fprintf(stdout, "one cell = %.0f µs (the shortest forward); measured ", unit)
	}
	bubble := pp.BubbleLine(sim.Bubble(), *name, *p, *v, *m)
	fmt.Fprintln(stdout, bubble)
	if *svg != "" {
		f, err := os.Create(*svg)
		if err != nil {
			return fmt.Errorf("pp draw: --svg: %w", err)
		}
		if err := pp.SVG(f, sim, *p, *v, unit, *name+" schedule, p="+fmt.Sprint(*p)+" m="+fmt.Sprint(*m)+": "+bubble); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("pp draw: --svg: %w", err)
		}
		fmt.Fprintf(stdout, "tinyacc: wrote the timeline, its legend and the bubble to %s\n", *svg)
	}
	return nil
}

// tracedStep reads a run's merged trace (one track per rank, as `train
// --trace` writes it) and rebuilds one step's timeline; step < 0 picks the
// last step.
func tracedStep(path string, step int) (*pp.Traced, error) {
	ranks, err := trace.ReadRanks(path)
	if err != nil {
		return nil, err
	}
	if step < 0 {
		for _, e := range ranks[0] {
			if s, ok := e.Args["step"].(float64); ok && e.Cat == "pp" {
				step = max(step, int(s))
			}
		}
	}
	return pp.FromTrace(ranks, step)
}
