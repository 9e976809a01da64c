package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/plan"
)

// planFlags are plan's own flags; the rest are config keys as train takes
// them.
type planFlags struct {
	nproc, top, verify int
	rounds             int // --rounds: runs of each verified layout
	asJSON             bool
	profile, keep      string
	rest               []string // config flags, --config FILE included
}

// parsePlanFlags takes plan's flags (--flag N or --flag=N) out of args.
func parsePlanFlags(args []string) (planFlags, error) {
	f := planFlags{top: 10, rounds: 1}
	ints := map[string]*int{"--nproc": &f.nproc, "--top": &f.top, "--verify": &f.verify, "--rounds": &f.rounds}
	strs := map[string]*string{"--profile": &f.profile, "--keep": &f.keep}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--json" {
			f.asJSON = true
			continue
		}
		name, val, eq := strings.Cut(a, "=")
		ip, isInt := ints[name]
		sp, isStr := strs[name]
		if !isInt && !isStr {
			f.rest = append(f.rest, a)
			continue
		}
		if !eq {
			if i+1 >= len(args) {
				return f, fmt.Errorf("plan: %s needs a value", name)
			}
			i++
			val = args[i]
		}
		if isStr {
			*sp = val
			continue
		}
		n, err := strconv.Atoi(val)
		if err != nil || n < 0 {
			return f, fmt.Errorf("plan: %s %q: want a whole number >= 0", name, val)
		}
		*ip = n
	}
	if f.nproc < 1 {
		return f, errors.New("plan: --nproc N is required: the ranks to plan for, e.g. --nproc 4")
	}
	if f.top < 1 || f.rounds < 1 {
		return f, errors.New("plan: --top and --rounds must be at least 1")
	}
	return f, nil
}

// cmdPlan searches the layouts of --nproc ranks for the run train would
// start with the same config keys (plan.Search), prints the fastest
// predicted (--top) and the rules that excluded the others; --verify K
// then runs some of them (planVerify). `plan calibrate` measures the
// profile the prediction reads.
func cmdPlan(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "calibrate" {
		return planCalibrate(args[1:], stdout, stderr)
	}
	f, err := parsePlanFlags(args)
	if err != nil {
		return err
	}
	r, err := loadConfig(f.rest)
	if err != nil {
		return err
	}
	cfg := r.Config
	limit, source, err := memoryLimit(cfg)
	if err != nil {
		return err
	}
	prof, err := readProfile(f.profile, cfg.Train.PeakFLOPS, stderr)
	if err != nil {
		return err
	}
	perRank := limit / int64(f.nproc)
	res := plan.Search(cfg, f.nproc, perRank, prof)
	top := res.Fits[:min(f.top, len(res.Fits))]
	global := cfg.Train.BatchSize * cfg.Train.GradAccum
	if f.asJSON {
		enc := json.NewEncoder(stdout)
		for _, c := range top {
			if err := enc.Encode(planJSON(c, f, global*cfg.Model.BlockSize)); err != nil {
				return err
			}
		}
	} else {
		fmt.Fprintf(stdout, "%d layouts of %d ranks for a global batch of %d sequences of %d tokens; memory.limit=%s (%s per rank); %d fit\n",
			res.Enumerated, f.nproc, global, cfg.Model.BlockSize, source, trainer.FormatBytes(perRank), len(res.Fits))
		writePlanTable(stdout, top, global*cfg.Model.BlockSize)
	}
	ex := stdout
	if f.asJSON {
		ex = stderr
	}
	for _, e := range res.Excluded {
		fmt.Fprintln(ex, e)
	}
	if len(res.Fits) == 0 {
		return fmt.Errorf("plan: no layout of %d ranks fits: a smaller model or batch, more ranks, or more memory", f.nproc)
	}
	if f.verify > 0 {
		return planVerify(res.Fits, f, cfg.Model.BlockSize, stdout, stderr)
	}
	return nil
}

// readProfile loads the profile at path (default plan.DefaultPath) and
// says on stderr when it is missing (then the built-in guess is used) or
// was made on another machine.
func readProfile(path string, peakFLOPS float64, stderr io.Writer) (*plan.Profile, error) {
	if path == "" {
		p, err := plan.DefaultPath()
		if err != nil {
			return nil, err
		}
		path = p
	}
	prof, err := plan.Load(path)
	if errors.Is(err, plan.ErrNoProfile) {
		fmt.Fprintf(stderr, "tinyacc: plan: no profile at %s: predicting from train.peak_flops and guessed costs of communication; run 'tinyacc plan calibrate' for this machine's\n", path)
		return plan.Default(peakFLOPS), nil
	}
	if err != nil {
		return nil, err
	}
	if d := prof.Elsewhere(plan.ThisHost()); d != "" {
		fmt.Fprintf(stderr, "tinyacc: plan: profile %s was made on another machine (%s): run 'tinyacc plan calibrate' here for this one's rates\n", path, d)
	}
	return prof, nil
}

// planRow is one layout of plan --json.
type planRow struct {
	Layout     string   `json:"layout"`
	Flags      []string `json:"flags"`
	StepMS     float64  `json:"predicted_ms_per_step"`
	TokensPerS float64  `json:"predicted_tokens_per_s"`
	PerRank    int64    `json:"predicted_peak_bytes_per_rank"`
	Compute    float64  `json:"compute_share"`
	Comm       float64  `json:"exposed_comm_share"`
	Bubble     float64  `json:"bubble_share"`
}

// planJSON is c as plan --json prints it; tokens is the global batch's.
func planJSON(c plan.Candidate, f planFlags, tokens int) planRow {
	p := c.Pred
	return planRow{Layout: c.Name(), Flags: layoutFlags(c, f.rest), StepMS: 1e3 * p.Step, TokensPerS: float64(tokens) / p.Step,
		PerRank: c.PerRank, Compute: p.Compute / p.Step, Comm: p.Comm / p.Step, Bubble: p.Bubble / p.Step}
}

// layoutFlags are the flags that start c with `train --nproc N`: the
// config flags plan was given, then the layout's keys.
func layoutFlags(c plan.Candidate, rest []string) []string {
	out := append([]string(nil), rest...)
	for _, kv := range c.Flags {
		out = append(out, "--"+kv)
	}
	return out
}

// writePlanTable prints the layouts with their predictions; tokens is the
// global batch's tokens.
func writePlanTable(w io.Writer, cs []plan.Candidate, tokens int) {
	n := nameWidth(cs)
	fmt.Fprintf(w, "%-4s %-*s %10s %10s %12s %8s %8s %8s\n", "#", n, "layout", "ms/step", "tokens/s", "peak/rank", "compute", "comm", "bubble")
	for i, c := range cs {
		p := c.Pred
		fmt.Fprintf(w, "%-4d %-*s %10.1f %10.0f %12s %7.0f%% %7.0f%% %7.0f%%\n", i+1, n, c.Name(), 1e3*p.Step, float64(tokens)/p.Step,
			trainer.FormatBytes(c.PerRank), 100*p.Compute/p.Step, 100*p.Comm/p.Step, 100*p.Bubble/p.Step)
	}
}

// nameWidth is the width of the layout column: the longest name, at
// least the header's.
func nameWidth(cs []plan.Candidate) int {
	n := len("layout")
	for _, c := range cs {
		n = max(n, utf8.RuneCountInString(c.Name()))
	}
	return n
}
