package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// plotSeries are the panels of `tinyacc plot`, top to bottom: the metric
// drawn against step and the kind of metrics_file row it comes from. The
// train and eval losses share the first panel.
var plotSeries = []struct {
	title, kind, field string
	panel              int
}{
	{"train loss", "train", "loss", 0},
	{"eval loss", "eval", "loss", 0},
	{"learning rate", "train", "lr", 1},
	{"gradient norm", "train", "grad_norm", 2},
	{"tokens/s", "train", "tokens_per_s", 3},
}

var plotPanels = []string{"loss (train solid, eval dashed)", "learning rate", "gradient norm", "tokens/s"}

// runColours tell runs apart: one colour per run, across every panel.
var runColours = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"}

// plotRun is one metrics file: per series, its (step, value) points.
type plotRun struct {
	name   string
	points [][][2]float64 // indexed like plotSeries
}

// cmdPlot draws metrics_file outputs as one standalone SVG.
func cmdPlot(args []string, stdout io.Writer) error {
	var files []string
	to := ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--to":
			if i+1 >= len(args) {
				return errors.New("plot: --to needs a file name, e.g. --to loss.svg")
			}
			i++
			to = args[i]
		case strings.HasPrefix(a, "--to="):
			to = strings.TrimPrefix(a, "--to=")
		case strings.HasPrefix(a, "-"):
			return fmt.Errorf("plot: unknown flag %q; usage: tinyacc plot METRICS.jsonl... --to FILE.svg", a)
		default:
			files = append(files, a)
		}
	}
	if len(files) == 0 || to == "" {
		return errors.New("plot: usage: tinyacc plot METRICS.jsonl... --to FILE.svg (metrics_file outputs, several to compare runs)")
	}
	// The plot is SVG only: a file named .png would hold SVG that image
	// viewers refuse, so any other name is refused before any work.
	if !strings.EqualFold(filepath.Ext(to), ".svg") {
		return fmt.Errorf("plot: --to %s: plot writes SVG only; name the file FILE.svg (browsers and image viewers open it)", to)
	}
	var runs []plotRun
	for _, f := range files {
		r, err := readPlotRun(f)
		if err != nil {
			return err
		}
		runs = append(runs, r)
	}
	svg := renderSVG(runs)
	if err := os.WriteFile(to, []byte(svg), 0o644); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	fmt.Fprintf(stdout, "tinyacc: plotted %d run(s) to %s\n", len(runs), to)
	return nil
}

// readPlotRun reads the train and eval rows of one metrics file.
func readPlotRun(path string) (plotRun, error) {
	f, err := os.Open(path)
	if err != nil {
		return plotRun{}, fmt.Errorf("plot: %w", err)
	}
	defer f.Close()
	r := plotRun{name: filepath.Base(path), points: make([][][2]float64, len(plotSeries))}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	line := 0
	rows := 0
	for sc.Scan() {
		line++
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var row map[string]any
		if err := json.Unmarshal(sc.Bytes(), &row); err != nil {
			return r, fmt.Errorf("plot: %s line %d is not a metrics_file row: %v", path, line, err)
		}
		step, ok := row["step"].(float64)
		if !ok {
			continue // memory rows have no step
		}
		for i, s := range plotSeries {
			if row["kind"] != s.kind {
				continue
			}
			if v, ok := row[s.field].(float64); ok && !math.IsNaN(v) && !math.IsInf(v, 0) {
				r.points[i] = append(r.points[i], [2]float64{step, v})
				rows++
			}
		}
	}
	if err := sc.Err(); err != nil {
		return r, fmt.Errorf("plot: reading %s: %w", path, err)
	}
	if rows == 0 {
		return r, fmt.Errorf("plot: %s has no train or eval rows (is it a metrics_file?)", path)
	}
	return r, nil
}

// renderSVG lays the panels out one above the other, each with its own
// value range and the steps of all runs on x, one path per series per run.
func renderSVG(runs []plotRun) string {
	const w, ph, left, right, top, gap = 760.0, 170.0, 70.0, 20.0, 40.0, 50.0
	h := top + float64(len(plotPanels))*(ph+gap)
	var b strings.Builder
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">
<rect width="100%%" height="100%%" fill="white"/>
`, w, h, w, h)
	// Legend: one colour per run.
	for i, r := range runs {
		x := left + float64(i%3)*230
		y := 16 + float64(i/3)*14
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" fill="%s">■ %s</text>`+"\n", x, y, runColours[i%len(runColours)], html.EscapeString(r.name))
	}
	maxStep := 1.0
	for _, r := range runs {
		for _, pts := range r.points {
			for _, p := range pts {
				maxStep = max(maxStep, p[0])
			}
		}
	}
	for p, title := range plotPanels {
		y0 := top + float64(p)*(ph+gap) + 20
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, r := range runs {
			for i, s := range plotSeries {
				if s.panel == p {
					for _, pt := range r.points[i] {
						lo, hi = min(lo, pt[1]), max(hi, pt[1])
					}
				}
			}
		}
		if math.IsInf(lo, 0) {
			lo, hi = 0, 1
		}
		if hi == lo {
			hi = lo + 1
		}
		fmt.Fprintf(&b, `<g class="panel"><text x="%.0f" y="%.0f" font-weight="bold">%s</text>`+"\n", left, y0-6, html.EscapeString(title))
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#999"/>`+"\n", left, y0, w-left-right, ph)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="end">%s</text><text x="%.0f" y="%.0f" text-anchor="end">%s</text>`+"\n",
			left-4, y0+10, fmtTick(hi), left-4, y0+ph, fmtTick(lo))
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f">0</text><text x="%.0f" y="%.0f" text-anchor="end">step %.0f</text>`+"\n",
			left, y0+ph+14, w-right, y0+ph+14, maxStep)
		for ri, r := range runs {
			colour := runColours[ri%len(runColours)]
			for i, s := range plotSeries {
				if s.panel != p || len(r.points[i]) == 0 {
					continue
				}
				var d strings.Builder
				for k, pt := range r.points[i] {
					x := left + pt[0]/maxStep*(w-left-right)
					y := y0 + ph - (pt[1]-lo)/(hi-lo)*ph
					cmd := "L"
					if k == 0 {
						cmd = "M"
					}
					fmt.Fprintf(&d, "%s%.1f %.1f ", cmd, x, y)
				}
				dash := ""
				if s.kind == "eval" {
					dash = ` stroke-dasharray="5 3"`
				}
				fmt.Fprintf(&b, `<path data-run="%s" data-series="%s" d="%s" fill="none" stroke="%s" stroke-width="1.5"%s/>`+"\n",
					html.EscapeString(r.name), s.title, strings.TrimSpace(d.String()), colour, dash)
			}
		}
		b.WriteString("</g>\n")
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func fmtTick(v float64) string {
	if math.Abs(v) >= 1e4 || (v != 0 && math.Abs(v) < 1e-2) {
		return fmt.Sprintf("%.2e", v)
	}
	return fmt.Sprintf("%.3g", v)
}
