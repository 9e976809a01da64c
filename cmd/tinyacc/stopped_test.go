package main

import (
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A rank SIGSTOPped in the middle of `train --nproc 2` cannot act on
// anything: its peer fails at the communication deadline, naming it, and
// the whole job ends within the deadline plus a second of the stop. Past
// that second the peer's diagnosis of the silent rank (its probe and its
// notes to the others) or the launcher's SIGTERM grace, which
// a stopped process never answers, would be what the job waits for.
func TestStoppedRankEndsTheJobAtTheDeadline(t *testing.T) {
	bin := tinyaccBinary(t)
	const timeout = 3 * time.Second
	var once sync.Once
	var stopErr error
	var stopped time.Time
	start := time.Now()
	code, out := runUntil(t, bin, smallRun(100000, "--nproc", "2", "--train.log_every=1",
		fmt.Sprintf("--comm.timeout=%s", timeout)), func(cmd *exec.Cmd, line string) {
		if strings.Contains(line, "step      5/") {
			once.Do(func() {
				stopped = time.Now()
				stopErr = signalRank(cmd.Process.Pid, 1, syscall.SIGSTOP)
			})
		}
	})
	end := time.Now()
	t.Logf("the job ended %s after the stop", end.Sub(stopped))
	require.NoError(t, stopErr)
	require.False(t, stopped.IsZero(), "the job ended before its fifth step:\n%s", out)
	assert.Equal(t, 1, code, out)
	assert.Regexp(t, `tinyacc: rank 0: step \d+: .*comm: all_reduce on group "(dp|world)" seq \d+ failed after 3s: ranks \[1\] did not arrive \(rank 1: no answer: .*\)`, out)
	assert.Contains(t, out, "stopped ranks [1]")
	// The bound of the issue, wide of what it excludes: without the
	// launcher's kill the job waits the SIGTERM grace, and with a
	// full-second diagnosis it ends at about 4.1 s.
	assert.Less(t, end.Sub(stopped), timeout+time.Second, "the job must end within the deadline plus a second of the stop (it ran %s in all)", end.Sub(start))
}
