package plugins

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/trainer"
)

// Fit is a layout of the same ranks whose estimate fits a memory limit:
// the flags that turn the run into it, and its largest rank's need.
type Fit struct {
	Flags   string // e.g. "parallel.tp=4" or "zero.stage=3"
	PerRank int64  // the most bytes a rank of it needs (ProcessBytes)
}

func (f Fit) String() string {
	return fmt.Sprintf("%s (%s per rank)", f.Flags, trainer.FormatBytes(f.PerRank))
}

// Fits lists the layouts of world ranks (MeshDims: every split into tp ×
// pp × cp × dp, with each ZeRO stage where dp > 1) that the config
// accepts and whose need (Need, nproc of the ranks processes of this
// host) is at most perRank bytes, least memory first. Each is named by
// the flags that differ from cfg's: what a refused run can be changed to,
// computed rather than guessed.
func Fits(cfg config.Config, world, nproc int, perRank int64) []Fit {
	var out []Fit
	for _, l := range Layouts(cfg, world, MeshDims()) {
		flags := changedFlags(cfg, l.Config)
		if flags == "" || l.Err != nil {
			continue // the run itself
		}
		need, err := Need(l.Config, world, nproc)
		if err != nil {
			continue // a layout the config refuses
		}
		if need <= perRank {
			out = append(out, Fit{Flags: flags, PerRank: need})
		}
	}
	slices.SortStableFunc(out, func(a, b Fit) int { return cmp.Compare(a.PerRank, b.PerRank) })
	return out
}

// Need is the most bytes a rank of cfg on world ranks, nproc of them
// processes of this host, is estimated to need (ProcessBytes of
// EstimateProcesses: the transport's shared-memory rings included), or
// why the config or the layout is refused: what train checks before any
// work, but the memory limit.
func Need(cfg config.Config, world, nproc int) (int64, error) {
	if err := cfg.Validate(); err != nil {
		return 0, err
	}
	es, err := EstimateProcesses(cfg, world, nproc)
	if err != nil {
		return 0, err
	}
	var need int64
	for _, e := range es {
		need = max(need, e.ProcessBytes())
	}
	return need, nil
}

// changedFlags names, as flags, the layout keys whose values differ.
func changedFlags(was, now config.Config) string {
	var fs []string
	for _, k := range []struct {
		key      string
		was, now int
	}{
		{"parallel.dp", was.Parallel.DP, now.Parallel.DP}, {"parallel.tp", was.Parallel.TP, now.Parallel.TP},
		{"parallel.pp", was.Parallel.PP, now.Parallel.PP}, {"parallel.cp", was.Parallel.CP, now.Parallel.CP},
		{"zero.stage", was.Zero.Stage, now.Zero.Stage},
	} {
		if k.was != k.now {
			fs = append(fs, fmt.Sprintf("%s=%d", k.key, k.now))
		}
	}
	return strings.Join(fs, " ")
}

func divisors(n int) []int {
	var out []int
	for d := 1; d <= n; d++ {
		if n%d == 0 {
			out = append(out, d)
		}
	}
	return out
}

// maxFits is how many layouts a refusal names.
const maxFits = 4

// CheckMemory refuses a run of cfg on world ranks, nproc of them
// processes of this host, whose estimate es (EstimateProcesses) does not
// fit memory.limit (limit bytes shared by the local ranks of a host,
// source saying where it came from): trainer.CheckMemory's line naming the
// rank and the biggest item, then a line naming the layouts of the same
// ranks and processes that would fit (at most maxFits, least memory
// first), or saying that none does.
func CheckMemory(cfg config.Config, world, nproc int, es []trainer.MemoryEstimate, limit int64, local int, source string) error {
	err := trainer.CheckMemory(es, limit, local, source)
	if err == nil {
		return nil
	}
	fits := Fits(cfg, world, nproc, limit/int64(max(local, 1)))
	if len(fits) == 0 {
		return fmt.Errorf("%w\nfits: no layout of %d ranks; a smaller model or batch, more ranks, or more memory", err, world)
	}
	names := make([]string, 0, maxFits)
	for _, f := range fits[:min(len(fits), maxFits)] {
		names = append(names, f.String())
	}
	more := ""
	if len(fits) > maxFits {
		more = fmt.Sprintf(" (and %d more)", len(fits)-maxFits)
	}
	return fmt.Errorf("%w\nfits: %s%s", err, strings.Join(names, ", "), more)
}
