package plan

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins"
)

// Candidate is a layout that fits, with its estimate and prediction.
type Candidate struct {
	plugins.Layout
	World   int
	PerRank int64 // the most bytes a rank needs (plugins.Need)
	Pred    Prediction
}

// Name is the layout in a few words (see Name).
func (c Candidate) Name() string { return Name(c.Config, c.World) }

// Name names cfg's layout on world ranks: the mesh (dp, then tp, pp, cp
// and expert parallel's ep above 1), ZeRO, the pipeline's schedule, the micro-batches (count ×
// sequences) and the recomputation.
func Name(cfg config.Config, world int) string {
	p := cfg.Parallel
	dp := world / (p.TP * p.PP * p.CP)
	var b strings.Builder
	fmt.Fprintf(&b, "dp%d", dp)
	for _, d := range []struct {
		n string
		v int
	}{{"tp", p.TP}, {"pp", p.PP}, {"cp", p.CP}, {"ep", p.EP}} {
		if d.v > 1 {
			fmt.Fprintf(&b, " %s%d", d.n, d.v)
		}
	}
	if cfg.TP.SequenceParallel && p.TP > 1 {
		b.WriteString("+sp")
	}
	if cfg.Zero.Stage > 0 {
		fmt.Fprintf(&b, " z%d", cfg.Zero.Stage)
	}
	if p.PP > 1 {
		fmt.Fprintf(&b, " %s", cfg.PP.Schedule)
		if cfg.PP.VirtualStages > 1 {
			fmt.Fprintf(&b, "/v%d", cfg.PP.VirtualStages)
		}
	}
	fmt.Fprintf(&b, " m%d×b%d", cfg.Train.GradAccum, cfg.Train.BatchSize)
	if g := cfg.Recompute.Granularity; g != "none" {
		fmt.Fprintf(&b, " rc:%s", g)
	}
	return b.String()
}

// Exclusion is a rule that excluded layouts, and how many.
type Exclusion struct {
	Rule  string
	Count int
}

func (e Exclusion) String() string {
	s := "s"
	if e.Count == 1 {
		s = ""
	}
	return fmt.Sprintf("%d layout%s %s", e.Count, s, e.Rule)
}

// Result is a search: the layouts that fit, fastest predicted first, and
// the rules that excluded the others. len(Fits) plus every exclusion's
// count is Enumerated.
type Result struct {
	Fits       []Candidate
	Excluded   []Exclusion
	Enumerated int
}

// Search enumerates the layouts of world ranks of cfg (plugins.PlanDims
// at cfg's global batch, train.batch_size × train.grad_accum), refuses
// those train would refuse (plugins.Need: config validation and the
// layout against the world), excludes those whose largest rank needs
// more than perRank bytes (0: no limit), and predicts the rest's step
// time on p. Each rank is a process of train --nproc world, its need
// counted as train's memory check counts it (plugins.Need: the
// transport's shared-memory rings included).
func Search(cfg config.Config, world int, perRank int64, p *Profile) Result {
	global := cfg.Train.BatchSize * cfg.Train.GradAccum
	var res Result
	counts := map[string]int{}
	shown := map[string]string{} // a rule's line: its first layout's words
	var order []string
	exclude := func(rule, line string) {
		if counts[rule] == 0 {
			order = append(order, rule)
			shown[rule] = line
		}
		counts[rule]++
	}
	memRule := fmt.Sprintf("need > %s per rank (memory.limit over %d ranks)", trainer.FormatBytes(perRank), world)
	for _, l := range plugins.Layouts(cfg, world, plugins.PlanDims(global)) {
		res.Enumerated++
		err := l.Err
		var need int64
		if err == nil {
			need, err = plugins.Need(l.Config, world, world)
		}
		if err != nil {
			line, _, _ := strings.Cut(err.Error(), "\n")
			exclude(ruleOf(err), "refused by train, e.g. "+line)
			continue
		}
		if perRank > 0 && need > perRank {
			exclude(memRule, memRule)
			continue
		}
		pred, err := Predict(l.Config, world, p)
		if err != nil {
			exclude("predict: "+ruleOf(err), "not predicted, e.g. "+err.Error())
			continue
		}
		res.Fits = append(res.Fits, Candidate{Layout: l, World: world, PerRank: need, Pred: pred})
	}
	sort.SliceStable(res.Fits, func(i, j int) bool { return res.Fits[i].Pred.Step < res.Fits[j].Pred.Step })
	for _, r := range order {
		res.Excluded = append(res.Excluded, Exclusion{Rule: shown[r], Count: counts[r]})
	}
	return res
}

var keyValue = regexp.MustCompile(`= ?[0-9]+`)

// ruleOf is the rule an error states: its first line with every key's
// number written N (parallel.pp=N), so that the same check on different
// layouts counts once (and is shown with the first layout's numbers).
func ruleOf(err error) string {
	line, _, _ := strings.Cut(err.Error(), "\n")
	return keyValue.ReplaceAllString(line, "=N")
}
