package main

import (
	"encoding/xml"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPlotIsSVGWithOnePathPerSeriesPerRun writes two metrics files, plots
// them together, and parses the result as XML: an <svg> root holding one
// path per series (train loss, eval loss, lr, gradient norm, tokens/s) per
// run.
func TestPlotIsSVGWithOnePathPerSeriesPerRun(t *testing.T) {
	dir := t.TempDir()
	var files []string
	for run := 0; run < 2; run++ {
		var b strings.Builder
		for s := 1; s <= 6; s++ {
			fmt.Fprintf(&b, `{"kind":"train","step":%d,"loss":%g,"lr":0.001,"grad_norm":%g,"tokens_per_s":%d,"step_ms":10,"mfu":0.1}`+"\n", s, 5.0-0.3*float64(s+run), 1.0/float64(s), 1000+run*100)
			if s%3 == 0 {
				fmt.Fprintf(&b, `{"kind":"eval","step":%d,"loss":%g}`+"\n", s, 5.2-0.3*float64(s))
			}
		}
		b.WriteString(`{"kind":"memory","rank":0,"params_bytes":1}` + "\n")
		f := filepath.Join(dir, fmt.Sprintf("run%d.jsonl", run))
		require.NoError(t, os.WriteFile(f, []byte(b.String()), 0o644))
		files = append(files, f)
	}
	out := filepath.Join(dir, "plot.svg")
	code, stdout, stderr := runCLI(append(append([]string{"plot"}, files...), "--to", out)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "plotted 2 run(s) to "+out)
	raw, err := os.ReadFile(out)
	require.NoError(t, err)
	var doc struct {
		XMLName xml.Name
		Panels  []struct {
			Paths []struct {
				Run    string `xml:"data-run,attr"`
				Series string `xml:"data-series,attr"`
				D      string `xml:"d,attr"`
			} `xml:"path"`
		} `xml:"g"`
	}
	require.NoError(t, xml.Unmarshal(raw, &doc))
	require.Equal(t, "svg", doc.XMLName.Local)
	require.Equal(t, "http://www.w3.org/2000/svg", doc.XMLName.Space)
	count := map[string]int{}
	for _, p := range doc.Panels {
		for _, path := range p.Paths {
			require.True(t, strings.HasPrefix(path.D, "M"), path.D)
			count[path.Run+" "+path.Series]++
		}
	}
	want := map[string]int{}
	for _, run := range []string{"run0.jsonl", "run1.jsonl"} {
		for _, s := range []string{"train loss", "eval loss", "learning rate", "gradient norm", "tokens/s"} {
			want[run+" "+s] = 1
		}
	}
	require.Equal(t, want, count)

	code, _, stderr = runCLI("plot", files[0])
	require.Equal(t, 1, code)
	require.Equal(t, "tinyacc: plot: usage: tinyacc plot METRICS.jsonl... --to FILE.svg (metrics_file outputs, several to compare runs)\n", stderr)
}

// TestPlotRefusesNonSVG: a --to name that is not .svg is refused before
// anything is read or written, so no .png holds SVG.
func TestPlotRefusesNonSVG(t *testing.T) {
	dir := t.TempDir()
	png := filepath.Join(dir, "x.png")
	code, _, stderr := runCLI("plot", filepath.Join(dir, "missing.jsonl"), "--to", png)
	require.Equal(t, 1, code)
	require.Equal(t, "tinyacc: plot: --to "+png+": plot writes SVG only; name the file FILE.svg (browsers and image viewers open it)\n", stderr)
	_, err := os.Stat(png)
	require.True(t, os.IsNotExist(err), "no file written")
}
