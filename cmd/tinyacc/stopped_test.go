package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A rank SIGSTOPped in the middle of `train --nproc 2` cannot act on
// anything: its peer fails at the communication deadline, its probe of the
// silent rank included, naming it, and the whole job ends within the
// deadline plus a second of the stop, not after a diagnosis on top of the
// deadline or the launcher's SIGTERM grace, which a stopped process never
// answers.
func TestStoppedRankEndsTheJobAtTheDeadline(t *testing.T) {
	bin := tinyaccBinary(t)
	const timeout = 3 * time.Second
	cmd := exec.Command(bin, smallRun(100000, "--nproc", "2", "--train.log_every=1", fmt.Sprintf("--comm.timeout=%s", timeout))...)
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
	var out bytes.Buffer
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	start := time.Now()
	require.NoError(t, cmd.Start())
	var stopErr error
	var stopped time.Time
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if stopped.IsZero() && strings.Contains(sc.Text(), "step      5/") {
				stopped = time.Now()
				stopErr = signalRank(cmd.Process.Pid, 1, syscall.SIGSTOP)
			}
		}
	}()
	_ = cmd.Wait()
	end := time.Now()
	pw.Close()
	<-scanned
	code := cmd.ProcessState.ExitCode()
	t.Logf("the job ended %s after the stop", end.Sub(stopped))
	require.NoError(t, stopErr)
	require.False(t, stopped.IsZero(), "the job ended before its fifth step:\n%s", out.String())
	assert.Equal(t, 1, code, out.String())
	assert.Regexp(t, `tinyacc: rank 0: step \d+: .*comm: all_reduce on group "(dp|world)" seq \d+ failed after 3s: ranks \[1\] did not arrive \(rank 1: no answer: .*\)`, out.String())
	assert.Contains(t, out.String(), "stopped ranks [1]")
	// The bound of the issue, wide of what it excludes: without the
	// launcher's kill the job waits the SIGTERM grace (3 s more), and with
	// a full second of diagnosis after the deadline it ended 4.1 to 4.4 s
	// after the stop.
	assert.Less(t, end.Sub(stopped), timeout+time.Second, "the job must end within the deadline plus a second of the stop (it ran %s in all)", end.Sub(start))
}
