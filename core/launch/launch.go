package launch

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
)

// RankError reports a job that ended because a rank failed. It carries what a
// person needs to start debugging: which rank failed first (later failures
// are usually consequences), how, and what it printed last.
type RankError struct {
	Rank     int            // global rank that failed first
	Code     int            // its exit status; meaningful when Signal is 0
	Signal   syscall.Signal // the signal that killed it, or 0
	Stopped  []int          // ranks still running that the launcher stopped
	Restarts int            // restarts done before this final failure
	Tail     []string       // its last lines of output, oldest first
	status   exitStatus
}

// Error reads, for example:
//
//	launch: rank 2 exited with status 3 (first failure); stopped ranks [0 1 3]
//	rank 2 last output:
//	  ...
func (e *RankError) Error() string {
	var b strings.Builder
	first := "first failure"
	if e.Restarts > 0 {
		first = fmt.Sprintf("first failure, after %d restarts", e.Restarts)
	}
	fmt.Fprintf(&b, "launch: rank %d %s (%s); ", e.Rank, e.status, first)
	if len(e.Stopped) == 0 {
		b.WriteString("no other ranks were running")
	} else {
		b.WriteString("stopped ranks " + formatRanks(e.Stopped))
	}
	if len(e.Tail) == 0 {
		fmt.Fprintf(&b, "\nrank %d printed nothing", e.Rank)
	} else {
		fmt.Fprintf(&b, "\nrank %d last output:", e.Rank)
		for _, l := range e.Tail {
			b.WriteString("\n  " + l)
		}
	}
	return b.String()
}

// ExitCode is the failing rank's own exit code, or 128+signal, so that
// wrappers (schedulers, CI) see the same code as without the launcher.
func (e *RankError) ExitCode() int { return e.status.exitCode() }

// InterruptedError reports a job stopped because the launcher received a
// signal, which it forwarded to the ranks.
type InterruptedError struct {
	Signal  os.Signal
	Stopped []int
}

func (e *InterruptedError) Error() string {
	name := e.Signal.String()
	if s, ok := e.Signal.(syscall.Signal); ok {
		name = signalName(s)
	}
	return fmt.Sprintf("launch: received %s; forwarded it to ranks %s and stopped them", name, formatRanks(e.Stopped))
}

// ExitCode follows the shell convention for a process ended by a signal.
func (e *InterruptedError) ExitCode() int {
	if s, ok := e.Signal.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return 1
}

// ExitCode maps an error from Run to the launcher's exit status: 0 for nil,
// the failing rank's code, 128+signal after an interrupt, 1 otherwise.
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	var coded interface{ ExitCode() int }
	if errors.As(err, &coded) {
		return coded.ExitCode()
	}
	return 1
}

// Run starts o.NProc copies of argv and supervises them until all succeed,
// one fails (then all are stopped, and the whole job restarted up to
// o.MaxRestarts times), ctx is canceled, or a signal arrives on o.Signals.
// A failure is returned as *RankError, an interrupt as *InterruptedError.
func Run(ctx context.Context, o Options, argv []string) error {
	o = o.withDefaults()
	if err := o.validate(argv); err != nil {
		return err
	}
	token, err := jobToken(o.Env, o.NNodes)
	if err != nil {
		return err
	}
	out := &output{stdout: o.Stdout, stderr: o.Stderr}
	warnOversubscribed(o.NProc, out)

	// Pdeathsig fires when the OS thread that started a child exits, not
	// the process; pinning this goroutine keeps that thread alive for as
	// long as the ranks are supervised.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	for attempt := 0; ; attempt++ {
		port := o.MasterPort
		if port == 0 {
			// A fresh port per attempt: a process of the failed attempt
			// that escaped its group could still hold the old one.
			if port, err = FreePort(o.MasterAddr); err != nil {
				return err
			}
		}
		j, err := startJob(o, out, argv, port, token, attempt)
		if err != nil {
			return err
		}
		res := j.supervise(ctx)
		switch {
		case res.signal != nil:
			return &InterruptedError{Signal: res.signal, Stopped: res.stopped}
		case res.canceled:
			return fmt.Errorf("launch: stopped ranks %s: %w", formatRanks(res.stopped), ctx.Err())
		case res.failed == nil:
			return nil
		}
		f := res.failed
		rerr := &RankError{Rank: f.global, Code: f.status.code, Signal: f.status.signal,
			Stopped: res.stopped, Restarts: attempt, Tail: f.tail.snapshot(), status: f.status}
		if attempt >= o.MaxRestarts {
			return rerr
		}
		out.log(fmt.Sprintf("launch: rank %d %s; stopped ranks %s; restarting the job (restart %d of %d)",
			f.global, f.status, formatRanks(res.stopped), attempt+1, o.MaxRestarts))
	}
}

// Main is "tinyacc launch": args are the arguments after "launch". It returns
// the process exit code: 0 on success, 2 for bad flags, otherwise as ExitCode.
// SIGINT and SIGTERM are caught and forwarded to the ranks instead of killing
// the launcher, so that ranks are never left running without it.
func Main(args []string, stdout, stderr io.Writer) int {
	o, argv, err := ParseArgs(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, Usage())
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "%v\nrun \"tinyacc launch --help\" for the flags\n", err)
		return 2
	}
	o.Stdout, o.Stderr = stdout, stderr
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	o.Signals = sigs

	err = Run(context.Background(), o, argv)
	if err != nil {
		fmt.Fprintln(stderr, err)
	}
	return ExitCode(err)
}
