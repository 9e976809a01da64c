package launch

import (
	"context"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	// pollEvery is how often a stop looks for processes left in the ranks'
	// groups; orphaned grandchildren send no exit notice, so polling is the
	// only way to see them go.
	pollEvery = 20 * time.Millisecond
	// killWait bounds the wait after SIGKILL, which only a process stuck in
	// the kernel (uninterruptible I/O) can outlast.
	killWait = time.Second
	// drainWait bounds the wait for output after the ranks stopped; only a
	// process that left its rank's group can hold a pipe open that long.
	drainWait = time.Second
)

// job is one attempt: ranks started together and stopped together.
type job struct {
	o       Options
	out     *output
	ranks   []*rank
	exits   chan exitEvent
	running int
}

// outcome says how an attempt ended. All fields zero means success.
type outcome struct {
	failed   *rank     // first rank that failed
	stopped  []int     // ranks still running when the job was stopped
	signal   os.Signal // the launcher was interrupted by this signal
	canceled bool      // the context was canceled
}

// startJob starts every local rank. If one cannot start, those already
// running are stopped, since a partial job could only hang at rendezvous.
func startJob(o Options, out *output, argv []string, port int, token string, attempt int) (*job, error) {
	j := &job{o: o, out: out, exits: make(chan exitEvent, o.NProc)}
	threads := threadsPerRank(o.CPUs, o.NProc)
	for local := 0; local < o.NProc; local++ {
		env := rankEnv(o.Env, o, rankSpec{local: local, port: port, token: token, attempt: attempt, threadsPer: threads})
		r, err := startRank(argv, env, out, local, o.globalRank(local), o.TailLines)
		if err != nil {
			j.stop(syscall.SIGTERM, true)
			return nil, err
		}
		j.ranks = append(j.ranks, r)
		j.running++
		go r.wait(j.exits)
	}
	return j, nil
}

// supervise waits until every rank succeeded, one failed, or the launcher was
// told to stop; in the last two cases it stops the rest before returning.
func (j *job) supervise(ctx context.Context) outcome {
	for j.running > 0 {
		select {
		case ev := <-j.exits:
			j.record(ev)
			if !ev.status.ok() {
				res := outcome{failed: ev.r, stopped: j.runningRanks()}
				j.stop(syscall.SIGTERM, true)
				return res
			}
		case sig := <-j.o.Signals:
			res := outcome{signal: sig, stopped: j.runningRanks()}
			s, ok := sig.(syscall.Signal)
			if !ok {
				s = syscall.SIGTERM
			}
			j.stop(s, false)
			return res
		case <-ctx.Done():
			res := outcome{canceled: true, stopped: j.runningRanks()}
			j.stop(syscall.SIGTERM, false)
			return res
		}
	}
	// Every rank succeeded, but what they started in the background would
	// outlive the job and keep its ports and files busy.
	j.stop(syscall.SIGTERM, false)
	return outcome{}
}

func (j *job) record(ev exitEvent) {
	ev.r.exited, ev.r.status = true, ev.status
	j.running--
}

// runningRanks lists the global ranks whose leader has not exited.
func (j *job) runningRanks() []int {
	ranks := []int{}
	for _, r := range j.ranks {
		if !r.exited {
			ranks = append(ranks, r.global)
		}
	}
	return ranks
}

func (j *job) pgids() map[int]bool {
	g := make(map[int]bool, len(j.ranks))
	for _, r := range j.ranks {
		g[r.pgid] = true
	}
	return g
}

// stop sends sig to every rank's group, gives them StopGrace to finish, then
// kills whatever is left, so a stop always ends within about StopGrace plus a
// second. Groups already empty are not signalled, since their id could by
// then name another process's group.
//
// The grace is for ranks that can use it: finishing a step, writing a
// checkpoint. When the job is failing (a rank died), a group with a stopped
// or traced member is killed at once instead: that member cannot act on sig
// until someone resumes it, and waiting for it would only make the failed
// job end a grace period later than its peers' deadline.
func (j *job) stop(sig syscall.Signal, failing bool) {
	live, _ := liveGroups(j.pgids())
	for _, r := range j.ranks {
		if !r.exited || live[r.pgid] {
			r.signalGroup(sig)
		}
	}
	if !j.waitStopped(j.o.StopGrace, failing) {
		for _, r := range j.ranks {
			r.signalGroup(syscall.SIGKILL)
		}
		if !j.waitStopped(killWait, false) {
			j.out.log("launch: ranks " + formatRanks(j.runningRanks()) + " did not exit after SIGKILL; giving up on them")
		}
	}
	j.drainOutput()
}

// waitStopped waits until every leader has exited and every group is empty,
// or d passed, or the launcher got another signal (a second Ctrl-C means
// "stop now"). With killFrozen, groups with a stopped or traced member are
// killed as soon as they are seen.
func (j *job) waitStopped(d time.Duration, killFrozen bool) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		live, frozen := liveGroups(j.pgids())
		if j.running == 0 && len(live) == 0 {
			return true
		}
		if killFrozen {
			for _, r := range j.ranks {
				if frozen[r.pgid] {
					r.signalGroup(syscall.SIGKILL)
				}
			}
		}
		select {
		case ev := <-j.exits:
			j.record(ev)
		case <-tick.C:
		case <-deadline.C:
			return false
		case <-j.o.Signals:
			return false
		}
	}
}

// drainOutput lets the pumps write the ranks' last lines, so the summary and
// the terminal both see them, then releases the pipes.
func (j *job) drainOutput() {
	done := make(chan struct{})
	go func() {
		for _, r := range j.ranks {
			r.pumps.Wait()
		}
		close(done)
	}()
	timer := time.NewTimer(drainWait)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
	}
	for _, r := range j.ranks {
		r.closeReaders()
	}
}

// formatRanks prints ranks as "[0 1 3]", sorted.
func formatRanks(ranks []int) string {
	s := append([]int(nil), ranks...)
	sort.Ints(s)
	parts := make([]string, len(s))
	for i, r := range s {
		parts[i] = strconv.Itoa(r)
	}
	return "[" + strings.Join(parts, " ") + "]"
}
