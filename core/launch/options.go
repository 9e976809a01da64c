// Package launch starts the N local processes of a distributed job the way
// torchrun does, so that any program (tinyacc itself, a Python script, a C
// program) finds its rank and rendezvous address in the environment.
//
// The launcher owns the whole process tree of every rank: each rank runs in its
// own process group, a failing rank takes the job down within seconds, and
// the job ends with a summary naming the rank that failed first and its last
// lines of output. Silent hangs and orphaned processes are the two failure
// modes it exists to prevent.
package launch

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"
)

// Defaults shared by the flag parser and Run.
const (
	// DefaultMasterAddr is the rendezvous host for single-node jobs.
	DefaultMasterAddr = "127.0.0.1"
	// DefaultStopGrace is how long ranks get between SIGTERM and SIGKILL. It
	// leaves room for a rank to flush logs yet keeps the whole stop well
	// under five seconds, so a crash never looks like a hang.
	DefaultStopGrace = 3 * time.Second
	// DefaultTailLines is how many recent output lines are kept per rank for
	// the failure summary: enough for a Python traceback's last frames.
	DefaultTailLines = 20
)

// Options configures one launch. The zero value of every field except NProc
// means "use the default", so callers set only what they care about.
type Options struct {
	NProc       int    // processes on this node (LOCAL_WORLD_SIZE)
	NNodes      int    // nodes in the job; 0 means 1
	NodeRank    int    // this node's index in [0, NNodes)
	MasterAddr  string // rendezvous host; "" means DefaultMasterAddr
	MasterPort  int    // rendezvous port; 0 picks a free one (single node only)
	MaxRestarts int    // how many times a failed job is restarted as a whole

	// StopGrace is the wait between SIGTERM and SIGKILL; 0 means
	// DefaultStopGrace.
	StopGrace time.Duration
	// TailLines bounds the per-rank output kept for the failure summary; 0
	// means DefaultTailLines.
	TailLines int
	// CPUs is the core count shared out to the ranks' thread-count
	// variables; 0 means runtime.NumCPU(). Settable so tests need not depend
	// on the machine.
	CPUs int
	// Env is the environment the ranks inherit; nil means os.Environ().
	Env []string
	// Stdout and Stderr receive the ranks' prefixed output and the
	// launcher's own messages (on Stderr); nil means os.Stdout/os.Stderr.
	// They need not be safe for concurrent use: the launcher serializes
	// writes.
	Stdout, Stderr io.Writer
	// Signals, when non-nil, delivers signals the launcher received (see
	// Main); each one is forwarded to every rank's process group and the job
	// stops without restarting.
	Signals <-chan os.Signal
}

// usage is printed for --help and after flag errors.
const usage = `usage: tinyacc launch [flags] -- PROGRAM [ARGS...]
       tinyacc launch [flags] SCRIPT.py [ARGS...]

Starts --nproc copies of PROGRAM (a .py script: of --python SCRIPT.py) with
the torchrun environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, GROUP_RANK) plus TINYACC_JOB_TOKEN and
TINYACC_RESTART.

flags:
`

// ParseArgs turns the arguments after "launch" into Options and the program's
// argv: everything after "--", or a .py script and its arguments (run with
// --python) when it comes first, as torchrun takes it. torchrun's spellings
// of the flags are accepted (see torchrun.go).
func ParseArgs(args []string) (Options, []string, error) {
	o := Options{NProc: 1, NNodes: 1}
	var python string
	var r refusal
	fs := flag.NewFlagSet("launch", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Var(countValue{&o.NProc, "nproc", &r}, "nproc", "processes to start on this node")
	fs.Var(countValue{&o.NNodes, "nnodes", &r}, "nnodes", "nodes in the job")
	fs.IntVar(&o.NodeRank, "node-rank", 0, "index of this node, 0..nnodes-1")
	fs.StringVar(&o.MasterAddr, "master-addr", DefaultMasterAddr, "rendezvous host (rank 0's node)")
	fs.IntVar(&o.MasterPort, "master-port", 0, "rendezvous port; 0 picks a free one (single node only)")
	fs.IntVar(&o.MaxRestarts, "max-restarts", 0, "restart the whole job up to this many times after a failure")
	fs.DurationVar(&o.StopGrace, "stop-grace", DefaultStopGrace, "wait between SIGTERM and SIGKILL when stopping ranks")
	fs.StringVar(&python, "python", DefaultPython, "the interpreter of a .py script given without --")
	addTorchrunFlags(fs, &o, &r)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return o, nil, err
		}
		if r.err != nil {
			return o, nil, r.err
		}
		return o, nil, fmt.Errorf("launch: %v", err)
	}
	rest := fs.Args()
	var argv []string
	if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
		argv = rest
	} else if len(rest) == 0 {
		return o, nil, errors.New(`launch: missing "--" before the program; use tinyacc launch --nproc N -- PROGRAM [ARGS...] (or --nproc N SCRIPT.py [ARGS...])`)
	} else {
		var err error
		if argv, err = programArgv(rest, python); err != nil {
			return o, nil, err
		}
	}
	if err := o.validate(argv); err != nil {
		return o, nil, err
	}
	return o, argv, nil
}

// Usage returns the flag help text, for the CLI's help output.
func Usage() string {
	return usage + `  --nproc N          processes to start on this node (default 1)
  --nnodes M         nodes in the job (default 1)
  --node-rank R      index of this node, 0..M-1 (default 0)
  --master-addr A    rendezvous host, rank 0's node (default 127.0.0.1)
  --master-port P    rendezvous port; required with --nnodes > 1, otherwise a free one is picked
  --max-restarts K   restart the whole job up to K times after a failure (default 0)
  --stop-grace D     wait between SIGTERM and SIGKILL when stopping ranks (default 3s)
  --python P         the interpreter of a SCRIPT.py given without "--" (default ` + DefaultPython + `)

torchrun's spellings work too: --nproc_per_node, --node_rank, --master_addr,
--master_port, --max_restarts (or with dashes), --rdzv_endpoint HOST:PORT
(= --master-addr HOST --master-port PORT), --rdzv_backend static|c10d,
--rdzv_id and --standalone (accepted, nothing to change).
`
}

// withDefaults fills the zero fields so the rest of the package never has to
// ask what zero means.
func (o Options) withDefaults() Options {
	if o.NNodes == 0 {
		o.NNodes = 1
	}
	if o.MasterAddr == "" {
		o.MasterAddr = DefaultMasterAddr
	}
	if o.StopGrace <= 0 {
		o.StopGrace = DefaultStopGrace
	}
	if o.TailLines <= 0 {
		o.TailLines = DefaultTailLines
	}
	if o.Env == nil {
		o.Env = os.Environ()
	}
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	return o
}

// validate rejects options that would start a job that cannot rendezvous, so
// the mistake is reported before any process starts.
func (o Options) validate(argv []string) error {
	if o.NProc < 1 {
		return fmt.Errorf("launch: --nproc must be at least 1, got %d", o.NProc)
	}
	if o.NNodes < 1 {
		return fmt.Errorf("launch: --nnodes must be at least 1, got %d", o.NNodes)
	}
	if o.NodeRank < 0 || o.NodeRank >= o.NNodes {
		return fmt.Errorf("launch: --node-rank %d is out of range for --nnodes %d; use 0..%d", o.NodeRank, o.NNodes, o.NNodes-1)
	}
	if o.MasterPort < 0 || o.MasterPort > 65535 {
		return fmt.Errorf("launch: --master-port %d is not a TCP port; use 1..65535, or 0 to pick a free one", o.MasterPort)
	}
	if o.NNodes > 1 && o.MasterPort == 0 {
		return fmt.Errorf("launch: --master-port is required with --nnodes %d, since every node must agree on it", o.NNodes)
	}
	if o.MaxRestarts < 0 {
		return fmt.Errorf("launch: --max-restarts must be 0 or more, got %d", o.MaxRestarts)
	}
	if len(argv) == 0 || argv[0] == "" {
		return errors.New(`launch: no program after "--"; use tinyacc launch --nproc N -- PROGRAM [ARGS...]`)
	}
	return nil
}
