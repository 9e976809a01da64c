package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/launch"
	"github.com/tinyacc/tinyacc/core/trace"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins"
)

// cmdTrain trains in one of three ways: one process; N processes of itself
// through the launcher (--nproc); or N goroutine ranks of this process
// (--local-ranks). A process started by a launcher (RANK and WORLD_SIZE set,
// or Open MPI, PMI or Slurm variables) joins its job through comm.backend.
func cmdTrain(args []string, stdout, stderr io.Writer) error {
	nproc, localRanks, rest, err := splitRankFlags(args)
	if err != nil {
		return err
	}
	r, err := loadConfig(rest) // fail on a bad config before starting anything
	if err != nil {
		return err
	}
	cfg := r.Config
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	switch {
	case nproc > 0:
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		argv := append([]string{exe, "train"}, rest...)
		err = launch.Run(ctx, launch.Options{NProc: nproc, Stdout: stdout, Stderr: stderr}, argv)
		if err != nil {
			return fmt.Errorf("train --nproc %d: %w", nproc, err)
		}
		return nil
	case localRanks > 0:
		cfg.Comm.Backend = "local"
		var mu sync.Mutex // ranks share stdout
		out := &lockedWriter{w: stdout, mu: &mu}
		return comm.RunLocal(localRanks, commOptions(cfg), func(g comm.Group) error {
			return trainRank(ctx, cfg, g, out, false)
		})
	case launched():
		g, err := comm.InitFromEnv(commOptions(cfg))
		if err != nil {
			return err
		}
		if err := trainRank(ctx, cfg, g, stdout, isTerminal(stdout)); err != nil {
			return fmt.Errorf("rank %d: %w", g.Rank(), err)
		}
		return g.Close()
	}
	return trainRank(ctx, cfg, nil, stdout, isTerminal(stdout))
}

// trainRank trains this rank; world is nil for a single process.
func trainRank(ctx context.Context, cfg config.Config, world comm.Group, stdout io.Writer, live bool) error {
	rank, size := 0, 1
	if world != nil {
		rank, size = world.Rank(), world.Size()
	}
	ps, err := plugins.Build(cfg, world)
	if err != nil {
		return err
	}
	var rec *trace.Recorder
	if cfg.Trace != "" {
		rec = trace.New(rank)
	}
	log := stdout
	if rank != 0 {
		log = io.Discard
	}
	t, err := trainer.New(cfg, trainer.Options{Plugins: ps, Log: log, Live: live, Rank: rank, World: size, Trace: rec})
	if err != nil {
		return err
	}
	res, err := t.Run(ctx)
	if err != nil {
		return err
	}
	if rec != nil {
		path := trace.RankPath(cfg.Trace, rank)
		if err := rec.WriteFile(path); err != nil {
			return err
		}
		fmt.Fprintf(log, "tinyacc: trace written to %s (one file per rank)\n", path)
	}
	if len(res.Steps) > 0 {
		fmt.Fprintf(log, "tinyacc: trained %d steps in %.1fs: loss %.4f -> %.4f\n",
			len(res.Steps), res.Duration.Seconds(), res.FirstLoss, res.LastLoss)
	}
	return nil
}

func commOptions(cfg config.Config) comm.Options {
	return comm.Options{Backend: cfg.Comm.Backend, Timeout: cfg.Comm.Timeout, Debug: os.Getenv("TINYACC_DEBUG") == "detail"}
}

// launched reports whether a launcher started this process as one rank of
// a job (tinyacc launch/torchrun, srun or mpirun).
func launched() bool {
	for _, k := range []string{"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"} {
		if n, err := strconv.Atoi(os.Getenv(k)); err == nil && n > 1 {
			return true
		}
	}
	return false
}

// splitRankFlags takes --nproc N and --local-ranks N out of args.
func splitRankFlags(args []string) (nproc, local int, rest []string, err error) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		var dst *int
		name := ""
		switch {
		case a == "--nproc" || strings.HasPrefix(a, "--nproc="):
			dst, name = &nproc, "--nproc"
		case a == "--local-ranks" || strings.HasPrefix(a, "--local-ranks="):
			dst, name = &local, "--local-ranks"
		default:
			rest = append(rest, a)
			continue
		}
		v, ok := strings.CutPrefix(a, name+"=")
		if !ok {
			if i+1 >= len(args) {
				return 0, 0, nil, fmt.Errorf("%s needs a number of ranks", name)
			}
			i++
			v = args[i]
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return 0, 0, nil, fmt.Errorf("%s %q: want a positive number of ranks", name, v)
		}
		*dst = n
	}
	if nproc > 0 && local > 0 {
		return 0, 0, nil, fmt.Errorf("--nproc and --local-ranks exclude each other: choose processes or goroutine ranks")
	}
	return nproc, local, rest, nil
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// lockedWriter serialises writes of goroutine ranks to one writer.
type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
