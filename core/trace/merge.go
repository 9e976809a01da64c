package trace

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
)

// file is the layout WriteFile and Merge write.
type file struct {
	TraceEvents []Event `json:"traceEvents"`
	OtherData   struct {
		Rank        *int  `json:"rank"`
		StartUnixUS int64 `json:"start_unix_us"`
	} `json:"otherData"`
}

// Merge writes one trace at path from the per-rank files of a run of
// world ranks (RankPath(path, r) for every rank r, as WriteFile wrote
// them): one process track per rank (pid = rank, named "rank N"), every
// rank's spans moved onto one clock whose zero is the earliest rank's
// start (each file records its start on the host's wall clock, so ranks
// of one host line up exactly; ranks of other hosts as well as their
// clocks agree). keepPerRank leaves the per-rank files in place;
// otherwise they are removed once the merged file is written.
func Merge(path string, world int, keepPerRank bool) error {
	docs := make([]file, world)
	first := int64(0)
	for r := range docs {
		src := RankPath(path, r)
		b, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("trace: merging rank %d's trace into %s: %w (on several hosts, trace must name a path every host shares)", r, path, err)
		}
		if err := json.Unmarshal(b, &docs[r]); err != nil {
			return fmt.Errorf("trace: %s: %w", src, err)
		}
		if docs[r].OtherData.Rank == nil || *docs[r].OtherData.Rank != r {
			return fmt.Errorf("trace: %s is not rank %d's trace of this run (its otherData names no such rank)", src, r)
		}
		if r == 0 || docs[r].OtherData.StartUnixUS < first {
			first = docs[r].OtherData.StartUnixUS
		}
	}
	var evs []Event
	for r, d := range docs {
		shift := float64(d.OtherData.StartUnixUS - first)
		for _, e := range d.TraceEvents {
			e.PID = r
			if e.Ph != "M" {
				e.TS += shift
			}
			evs = append(evs, e)
		}
	}
	// Metadata first, then spans in time order: viewers need neither, but
	// a reader scanning the file sees each rank named before its spans.
	sort.SliceStable(evs, func(i, j int) bool {
		mi, mj := evs[i].Ph == "M", evs[j].Ph == "M"
		if mi != mj {
			return mi
		}
		return !mi && evs[i].TS < evs[j].TS
	})
	b, err := json.Marshal(map[string]any{"traceEvents": evs, "displayTimeUnit": "ms",
		"otherData": map[string]any{"ranks": world, "start_unix_us": first}})
	if err != nil {
		return err
	}
	if err := writeAtomic(path, b); err != nil {
		return fmt.Errorf("trace %s: %w", path, err)
	}
	if keepPerRank {
		return nil
	}
	var errs []error
	for r := range world {
		if err := os.Remove(RankPath(path, r)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ReadRanks reads a merged trace (as Merge writes it) and returns the
// events of each rank, indexed by rank (pid), times on the merged clock.
func ReadRanks(path string) ([][]Event, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d file
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("trace: %s: %w", path, err)
	}
	var ranks [][]Event
	for _, e := range d.TraceEvents {
		if e.PID < 0 {
			return nil, fmt.Errorf("trace: %s: an event of pid %d (pids are ranks)", path, e.PID)
		}
		for len(ranks) <= e.PID {
			ranks = append(ranks, nil)
		}
		ranks[e.PID] = append(ranks[e.PID], e)
	}
	if len(ranks) == 0 {
		return nil, fmt.Errorf("trace: %s holds no events", path)
	}
	return ranks, nil
}
