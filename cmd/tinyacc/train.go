package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/launch"
	"github.com/tinyacc/tinyacc/core/trace"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins"
	"github.com/tinyacc/tinyacc/plugins/process"
)

// cmdTrain trains in one of three ways: one process; N processes of itself
// through the launcher (--nproc); or N goroutine ranks of this process
// (--local-ranks). A process started by a launcher (RANK and WORLD_SIZE set,
// or Open MPI, PMI or Slurm variables) joins its job through comm.backend.
func cmdTrain(args []string, stdout, stderr io.Writer) error {
	restarts, args, err := splitRestartFlag(args)
	if err != nil {
		return err
	}
	nproc, localRanks, rest, err := splitRankFlags(args)
	if err != nil {
		return err
	}
	r, err := loadConfig(rest) // fail on a bad config before starting anything
	if err != nil {
		return err
	}
	cfg := r.Config
	if world := max(nproc, localRanks); world > 0 || !launched() {
		// The layout and the memory estimate are checked here, once, by
		// the process that would start the ranks: nothing is allocated
		// or spawned for a run that cannot fit.
		if err := checkBeforeWork(cfg, max(world, 1), max(world, 1), nproc, stderr); err != nil {
			return err
		}
	}
	if nproc > 0 {
		if restarts > 0 && cfg.Checkpoint.Dir == "" {
			return fmt.Errorf("--max-restarts %d restarts the ranks from their latest checkpoint: set checkpoint.dir (and checkpoint.every)", restarts)
		}
		// Ranks asked to stop finish their step and write a checkpoint:
		// give them up to comm.timeout before they are killed (a second
		// signal kills them at once).
		grace := max(launch.DefaultStopGrace, cfg.Comm.Timeout)
		return trainNProc(nproc, restarts, grace, rest, stdout, stderr)
	}
	if restarts > 0 {
		return fmt.Errorf("--max-restarts needs --nproc: only a launched job can be restarted")
	}
	if n, _ := strconv.Atoi(os.Getenv(launch.RestartEnv)); n > 0 && cfg.Checkpoint.Dir != "" && cfg.Resume == "" {
		// A restarted rank continues from the job's latest checkpoint.
		cfg.Resume = "auto"
	}
	ctx, stop, got := interruptible(stderr)
	defer stop()
	err = trainWith(ctx, cfg, localRanks, stdout)
	var stopped *trainer.Interrupted
	if errors.As(err, &stopped) {
		if s, ok := got().(syscall.Signal); ok {
			return exitCoded{err: err, code: 128 + int(s)}
		}
	}
	return err
}

// exitCoded is an error with the process exit code it should end with.
type exitCoded struct {
	err  error
	code int
}

func (e exitCoded) Error() string { return e.err.Error() }
func (e exitCoded) Unwrap() error { return e.err }
func (e exitCoded) ExitCode() int { return e.code }

// trainWith runs the ranks of this process: goroutine ranks, one launched
// rank, or a single process.
func trainWith(ctx context.Context, cfg config.Config, localRanks int, stdout io.Writer) error {
	switch {
	case localRanks > 0:
		cfg.Comm.Backend = "local"
		limitHeap(cfg, localRanks, -1)
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
		limitHeap(cfg, g.Size(), g.Rank())
		if err := trainRank(ctx, cfg, g, stdout, isTerminal(stdout)); err != nil {
			return fmt.Errorf("rank %d: %w", g.Rank(), err)
		}
		return g.Close()
	}
	limitHeap(cfg, 1, 0)
	return trainRank(ctx, cfg, nil, stdout, isTerminal(stdout))
}

// trainNProc runs N processes of this program through the launcher, as
// `tinyacc launch` does: SIGINT and SIGTERM are forwarded to the ranks, and
// the error carries the exit code `run` returns (the failed rank's code,
// 128+signal for a rank killed by a signal or an interrupted job).
func trainNProc(nproc, restarts int, grace time.Duration, rest []string, stdout, stderr io.Writer) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	argv := append([]string{exe, "train"}, rest...)
	err = launch.Run(context.Background(), launch.Options{NProc: nproc, MaxRestarts: restarts, StopGrace: grace, Stdout: stdout, Stderr: stderr, Signals: sigs}, argv)
	if err != nil {
		return fmt.Errorf("train --nproc %d: %w", nproc, err)
	}
	return nil
}

// trainRank trains this rank; world is nil for a single process.
func trainRank(ctx context.Context, cfg config.Config, world comm.Group, stdout io.Writer, live bool) error {
	rank, size := 0, 1
	if world != nil {
		rank, size = world.Rank(), world.Size()
	}
	ps, m, err := plugins.Build(cfg, world)
	if err != nil {
		return err
	}
	defer process.CloseAll(ps) // whatever happens, no plugin process outlives the run
	var rec *trace.Recorder
	if cfg.Trace != "" {
		rec = trace.New(rank)
	}
	log := stdout
	if rank != 0 {
		log = io.Discard
	}
	t, err := trainer.New(cfg, trainer.Options{Plugins: ps, Mesh: m, Log: log, Live: live, Rank: rank, World: size, Trace: rec})
	if err != nil {
		return err
	}
	res, err := t.Run(ctx)
	if err != nil {
		return err
	}
	if rec != nil {
		if err := writeTrace(cfg, rec, world, log); err != nil {
			return err
		}
	}
	if res.StepsRun > 0 {
		fmt.Fprintf(log, "tinyacc: trained %d steps in %.1fs: loss %.4f -> %.4f\n",
			res.StepsRun, res.Duration.Seconds(), res.FirstLoss, res.LastLoss)
	}
	return nil
}

func commOptions(cfg config.Config) comm.Options {
	return comm.Options{Backend: cfg.Comm.Backend, Timeout: cfg.Comm.Timeout, Debug: os.Getenv("TINYACC_DEBUG") == "detail"}
}

// launched reports whether a launcher started this process as one rank of
// a job (tinyacc launch/torchrun, srun or mpirun). Any world size but 1
// counts, a bad one (0, -2, "x") included: joining the job refuses it,
// where training alone would ignore what the environment says.
func launched() bool {
	for _, k := range []string{"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"} {
		if v, ok := os.LookupEnv(k); ok && strings.TrimSpace(v) != "1" {
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

// isTerminal reports whether w is a terminal, the only place the live
// progress line (carriage returns, erase-line escapes) belongs. A file
// mode of "character device" is not enough: /dev/null and serial lines are
// character devices, and a log captured from them would hold the escapes.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && isatty.IsTerminal(f.Fd())
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

// interruptible returns a context cancelled by the first SIGINT or
// SIGTERM: the trainer finishes its step, writes a checkpoint when
// checkpoint.dir is set and stops. The signals' default action is then
// restored, so a second one ends the process at once.
func interruptible(stderr io.Writer) (context.Context, func(), func() os.Signal) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	var mu sync.Mutex
	var got os.Signal
	go func() {
		select {
		case s := <-sigs:
			signal.Reset(os.Interrupt, syscall.SIGTERM)
			mu.Lock()
			got = s
			mu.Unlock()
			fmt.Fprintf(stderr, "tinyacc: %v: finishing the current step, then stopping (send it again to stop at once)\n", s)
			cancel()
		case <-done:
		}
	}()
	stop := func() {
		signal.Stop(sigs)
		close(done)
		cancel()
	}
	return ctx, stop, func() os.Signal {
		mu.Lock()
		defer mu.Unlock()
		return got
	}
}

// splitRestartFlag takes --max-restarts K out of args.
func splitRestartFlag(args []string) (int, []string, error) {
	var rest []string
	n := 0
	for i := 0; i < len(args); i++ {
		a := args[i]
		v, ok := strings.CutPrefix(a, "--max-restarts=")
		if !ok && a != "--max-restarts" {
			rest = append(rest, a)
			continue
		}
		if !ok {
			if i+1 >= len(args) {
				return 0, nil, fmt.Errorf("--max-restarts needs a number")
			}
			i++
			v = args[i]
		}
		k, err := strconv.Atoi(v)
		if err != nil || k < 0 {
			return 0, nil, fmt.Errorf("--max-restarts %q: want a number of restarts, 0 or more", v)
		}
		n = k
	}
	return n, rest, nil
}
