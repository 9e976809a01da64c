package launch

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
)

// rank is one running process of the job together with everything the
// launcher needs to stop it and to explain its death.
type rank struct {
	local, global int
	cmd           *exec.Cmd
	pgid          int // == pid: each rank leads its own process group
	tail          *tail
	pumps         sync.WaitGroup
	readers       []*os.File // read ends of the output pipes
	exited        bool
	status        exitStatus
}

// exitEvent reports that a rank's leader process ended.
type exitEvent struct {
	r      *rank
	status exitStatus
}

// exitStatus is how a process ended: a code, or the signal that killed it.
type exitStatus struct {
	code   int            // meaningful when signal == 0
	signal syscall.Signal // nonzero when killed by a signal
	err    error          // the wait itself failed; status unknown
}

func (s exitStatus) ok() bool { return s.err == nil && s.signal == 0 && s.code == 0 }

// exitCode maps the status to a shell-style exit code: 128+signal for a
// killed process, as sh reports it, so scripts can tell the two apart.
func (s exitStatus) exitCode() int {
	switch {
	case s.err != nil:
		return 1
	case s.signal != 0:
		return 128 + int(s.signal)
	}
	return s.code
}

// String reads as the end of "rank 2 ...".
func (s exitStatus) String() string {
	switch {
	case s.err != nil:
		return fmt.Sprintf("could not be waited for (%v)", s.err)
	case s.signal != 0:
		return "was killed by signal " + signalName(s.signal)
	}
	return "exited with status " + strconv.Itoa(s.code)
}

func statusOf(st *os.ProcessState, waitErr error) exitStatus {
	if st == nil {
		if waitErr == nil {
			waitErr = errors.New("no process state")
		}
		return exitStatus{err: waitErr}
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return exitStatus{signal: ws.Signal()}
	}
	return exitStatus{code: st.ExitCode()}
}

// startRank starts one rank with its output pumped through out. Output goes
// through pipes the launcher owns (rather than exec's own copying) so that
// waiting for the process never waits for a grandchild that still holds the
// pipe open.
func startRank(argv, env []string, out *output, local, global, tailLines int) (*rank, error) {
	r := &rank{local: local, global: global, tail: newTail(tailLines)}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("launch: creating stdout pipe for rank %d: %w", global, err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("launch: creating stderr pipe for rank %d: %w", global, err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = outW, errW
	cmd.SysProcAttr = rankProcAttr()
	err = cmd.Start()
	// The child has its own copies now; ours must go so EOF arrives when
	// the rank's tree is gone.
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return nil, fmt.Errorf("launch: starting rank %d (%q): %w", global, argv[0], err)
	}
	r.cmd, r.pgid = cmd, cmd.Process.Pid
	r.readers = []*os.File{outR, errR}
	prefix := "[rank " + strconv.Itoa(global) + "] "
	r.pumps.Add(2)
	go func() { defer r.pumps.Done(); out.pump(outR, out.stdout, prefix, r.tail) }()
	go func() { defer r.pumps.Done(); out.pump(errR, out.stderr, prefix, r.tail) }()
	return r, nil
}

// wait reports the leader's end on exits.
func (r *rank) wait(exits chan<- exitEvent) {
	err := r.cmd.Wait()
	exits <- exitEvent{r: r, status: statusOf(r.cmd.ProcessState, err)}
}

// signalGroup signals every process in the rank's group, which is how a
// rank's children (data loaders, compilers, shells' subprocesses) are stopped
// with it. A group that is already empty is not an error.
func (r *rank) signalGroup(sig syscall.Signal) {
	_ = syscall.Kill(-r.pgid, sig)
}

// closeReaders unblocks the output pumps when a process that escaped the
// group (by starting its own session) still holds the pipes open.
func (r *rank) closeReaders() {
	for _, f := range r.readers {
		f.Close()
	}
}

// signalNames spells the signals a rank is likely to die of the way people
// search for them; syscall's own names ("killed", "segmentation fault") are
// harder to grep for.
var signalNames = map[syscall.Signal]string{
	syscall.SIGHUP: "SIGHUP", syscall.SIGINT: "SIGINT", syscall.SIGQUIT: "SIGQUIT",
	syscall.SIGILL: "SIGILL", syscall.SIGTRAP: "SIGTRAP", syscall.SIGABRT: "SIGABRT",
	syscall.SIGBUS: "SIGBUS", syscall.SIGFPE: "SIGFPE", syscall.SIGKILL: "SIGKILL",
	syscall.SIGUSR1: "SIGUSR1", syscall.SIGSEGV: "SIGSEGV", syscall.SIGUSR2: "SIGUSR2",
	syscall.SIGPIPE: "SIGPIPE", syscall.SIGALRM: "SIGALRM", syscall.SIGTERM: "SIGTERM",
	syscall.SIGXCPU: "SIGXCPU", syscall.SIGXFSZ: "SIGXFSZ", syscall.SIGSYS: "SIGSYS",
}

func signalName(s syscall.Signal) string {
	if n, ok := signalNames[s]; ok {
		return n
	}
	return "signal " + strconv.Itoa(int(s))
}
