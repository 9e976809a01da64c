package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// benchSoak trains a tiny GPT for many steps, one process and then --nproc
// N (4 by default), samples every process's resident memory 20 times, and
// prints the samples and each process's slope: the least-squares growth of
// its resident memory in MB per 1000 steps, fitted over the samples after
// the first quarter of the run (allocators and caches warm up first). A
// run that keeps per-step state shows a slope well above zero; a flat one
// shows a slope near zero. --peer runs the same with another tinyacc binary
// (an older build, say), side by side. Arguments after the flags are passed
// on to train, after the soak's own (--train.eval_every=50, say, to soak
// evaluation too).
func benchSoak(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	steps := fs.Int("steps", 20000, "training steps of each run")
	nproc := fs.Int("nproc", 4, "ranks of the multi-process run")
	peer := fs.String("peer", "", "another tinyacc binary to run the same soak with, for comparison")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *steps < soakSamples {
		return fmt.Errorf("bench soak: --steps=%d: give at least %d (memory is sampled every steps/%d)", *steps, soakSamples, soakSamples)
	}
	if *nproc < 2 {
		return fmt.Errorf("bench soak: --nproc=%d: give at least 2 (the one-process run is always made)", *nproc)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	bins := []string{self}
	if *peer != "" {
		if _, err := os.Stat(*peer); err != nil {
			return fmt.Errorf("bench soak: --peer: %w", err)
		}
		bins = append(bins, *peer)
	}
	dir, err := os.MkdirTemp("", "tinyacc-soak-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// A small corpus file keeps loading out of the picture.
	corpus := filepath.Join(dir, "corpus.txt")
	if err := os.WriteFile(corpus, []byte(strings.Repeat("func main() { println(\"soak\") }\n", 2000)), 0o644); err != nil {
		return err
	}
	model := "GPT 1 layer, width 16, context 16, batch 2"
	if len(fs.Args()) > 0 {
		model += ", then " + strings.Join(fs.Args(), " ")
	}
	fmt.Fprintf(stdout, "bench soak: %s; %d steps; resident memory (MiB) every %d steps; slope in MB per 1000 steps over the last three quarters\n", model, *steps, *steps/soakSamples)
	for _, n := range []int{1, *nproc} {
		for _, bin := range bins {
			if err := soakRun(bin, n, *steps, corpus, fs.Args(), stdout); err != nil {
				return err
			}
		}
	}
	return nil
}

// soakSamples is how many times a run's memory is sampled.
const soakSamples = 20

var stepLine = regexp.MustCompile(`step\s+(\d+)/(\d+)`)

// soakRun runs one training and prints, at every soakSamples-th of the
// steps, the resident memory of the process it started and of that
// process's children (the ranks, under --nproc), then each one's slope.
func soakRun(bin string, nproc, steps int, corpus string, extra []string, stdout io.Writer) error {
	args := []string{"train", "--model.n_layer=1", "--model.n_head=1", "--model.n_embd=16", "--model.block_size=16",
		"--train.batch_size=2", "--train.steps=" + strconv.Itoa(steps), "--train.eval_every=0", "--train.log_every=1",
		"--train.warmup_steps=0", "--train.threads=1", "--data.path=" + corpus, "--data.val_fraction=0"}
	args = append(args, extra...)
	label := "1 process"
	if nproc > 1 {
		args = append(args, "--nproc", strconv.Itoa(nproc))
		label = fmt.Sprintf("--nproc %d", nproc)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var errTail tailBuffer
	cmd.Stderr = &errTail
	if err := cmd.Start(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s  %s\n", label, bin)
	every := steps / soakSamples
	var names []string
	series := map[string][][2]float64{} // name -> (step, MB) samples
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		m := stepLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		s, _ := strconv.Atoi(m[1])
		if s%every != 0 {
			continue
		}
		pids := append([]int{cmd.Process.Pid}, children(cmd.Process.Pid)...)
		var cols []string
		for i, pid := range pids {
			name := "launcher"
			if nproc == 1 {
				name = "process"
			} else if i > 0 {
				name = fmt.Sprintf("rank %d", i-1)
			}
			mem := "  ended"
			if b := rss(pid); b > 0 {
				mem = fmt.Sprintf("%7.1f", float64(b)/(1<<20))
				if _, seen := series[name]; !seen {
					names = append(names, name)
				}
				series[name] = append(series[name], [2]float64{float64(s), float64(b) / 1e6})
			}
			cols = append(cols, name+" "+mem)
		}
		fmt.Fprintf(stdout, "  step %6d  %s\n", s, strings.Join(cols, "  "))
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("bench soak: %s %s: %w\n%s", bin, label, err, errTail.String())
	}
	var slopes []string
	for _, name := range names {
		pts := series[name]
		// The last sample can catch a rank already freeing its memory.
		slopes = append(slopes, fmt.Sprintf("%s %+.3f", name, 1000*slope(pts[len(pts)/4:len(pts)-1])))
	}
	fmt.Fprintf(stdout, "  slope (MB/1000 steps)  %s\n", strings.Join(slopes, "  "))
	return nil
}

// slope is the least-squares slope of y over x; 0 for fewer than 2 points.
func slope(pts [][2]float64) float64 {
	if len(pts) < 2 {
		return 0
	}
	var sx, sy float64
	for _, p := range pts {
		sx += p[0]
		sy += p[1]
	}
	n := float64(len(pts))
	mx, my := sx/n, sy/n
	var num, den float64
	for _, p := range pts {
		num += (p[0] - mx) * (p[1] - my)
		den += (p[0] - mx) * (p[0] - mx)
	}
	if den == 0 {
		return 0
	}
	return num / den
}

// children lists the child processes of pid, in start order.
func children(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// rss returns the resident memory of pid in bytes (0 when unknown).
func rss(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// tailBuffer keeps the last 4 KiB written to it, for an error message.
type tailBuffer struct{ b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 4096 {
		t.b = append(t.b[:0], t.b[len(t.b)-4096:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return string(t.b) }
