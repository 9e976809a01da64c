package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/trace"
)

// writeTrace writes the run's one trace file, cfg.Trace: every rank
// writes its spans to its own file (trace.RankPath), the ranks meet at a
// barrier (bounded by comm.timeout like every collective), and rank 0
// merges the files into one Perfetto/Chrome trace with one process track
// per rank, removing the per-rank files unless trace_per_rank is set.
// world is nil for a single process.
func writeTrace(cfg config.Config, rec *trace.Recorder, world comm.Group, log io.Writer) error {
	rank, size := 0, 1
	if world != nil {
		rank, size = world.Rank(), world.Size()
	}
	werr := rec.WriteFile(trace.RankPath(cfg.Trace, rank))
	if world != nil {
		// Every rank reaches the barrier, a failed write included, so
		// that no rank waits for one that gave up.
		if err := world.Barrier(); err != nil {
			return errors.Join(werr, fmt.Errorf("trace: waiting for every rank's trace file: %w", err))
		}
	}
	if werr != nil || rank != 0 {
		return werr
	}
	if err := trace.Merge(cfg.Trace, size, cfg.TracePerRank); err != nil {
		return err
	}
	also := ""
	if cfg.TracePerRank && size > 1 {
		also = fmt.Sprintf(", and per rank to %s … %s", trace.RankPath(cfg.Trace, 0), trace.RankPath(cfg.Trace, size-1))
	} else if cfg.TracePerRank {
		also = ", and to " + trace.RankPath(cfg.Trace, 0)
	}
	fmt.Fprintf(log, "tinyacc: trace written to %s (one track per rank%s)\n", cfg.Trace, also)
	return nil
}
