package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// baseEnv is a minimal, machine-independent environment for the ranks.
func baseEnv(extra ...string) []string {
	return append([]string{"PATH=" + os.Getenv("PATH")}, extra...)
}

func sh(script string) []string { return []string{"/bin/sh", "-c", script} }

// runSh runs script as every rank and returns what the ranks printed.
func runSh(t *testing.T, o Options, script string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errb bytes.Buffer
	o.Stdout, o.Stderr = &out, &errb
	if o.Env == nil {
		o.Env = baseEnv()
	}
	err = Run(context.Background(), o, sh(script))
	return out.String(), errb.String(), err
}

func sortedLines(s string) []string {
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	sort.Strings(lines)
	return lines
}

// processGone tells whether pid has stopped running. A zombie counts as
// gone: it has exited and merely waits for init to reap it.
func processGone(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
	}
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	return fields[0] == "Z" || fields[0] == "X"
}

const envScript = `echo "R=$RANK L=$LOCAL_RANK W=$WORLD_SIZE LW=$LOCAL_WORLD_SIZE G=$GROUP_RANK A=$MASTER_ADDR P=$MASTER_PORT T=$TINYACC_JOB_TOKEN RS=$TINYACC_RESTART OMP=$OMP_NUM_THREADS OB=$OPENBLAS_NUM_THREADS GMP=$GOMAXPROCS"`

func TestRanksGetTorchrunEnvironment(t *testing.T) {
	o := Options{NProc: 3, NNodes: 2, NodeRank: 1, MasterAddr: "10.1.2.3", MasterPort: 29555, CPUs: 8,
		Env: baseEnv("TINYACC_JOB_TOKEN=tok123", "RANK=99", "GOMAXPROCS=5")}
	stdout, stderr, err := runSh(t, o, envScript)
	require.NoError(t, err)
	assert.Empty(t, stderr)
	assert.Equal(t, []string{
		"[rank 3] R=3 L=0 W=6 LW=3 G=1 A=10.1.2.3 P=29555 T=tok123 RS=0 OMP=2 OB=2 GMP=5",
		"[rank 4] R=4 L=1 W=6 LW=3 G=1 A=10.1.2.3 P=29555 T=tok123 RS=0 OMP=2 OB=2 GMP=5",
		"[rank 5] R=5 L=2 W=6 LW=3 G=1 A=10.1.2.3 P=29555 T=tok123 RS=0 OMP=2 OB=2 GMP=5",
	}, sortedLines(stdout))
}

func TestSingleNodeDrawsTokenAndPort(t *testing.T) {
	o := Options{NProc: 2, CPUs: 1, Env: baseEnv("OPENBLAS_NUM_THREADS=3")}
	run := func() (token string, port int) {
		stdout, _, err := runSh(t, o, envScript)
		require.NoError(t, err)
		re := regexp.MustCompile(`^\[rank (\d)\] R=(\d) L=(\d) W=2 LW=2 G=0 A=127\.0\.0\.1 P=(\d+) T=([0-9a-f]{64}) RS=0 OMP=1 OB=3 GMP=1$`)
		lines := sortedLines(stdout)
		require.Len(t, lines, 2)
		for i, l := range lines {
			m := re.FindStringSubmatch(l)
			require.NotNil(t, m, "line %q", l)
			assert.Equal(t, []string{strconv.Itoa(i), strconv.Itoa(i), strconv.Itoa(i)}, m[1:4])
			p, _ := strconv.Atoi(m[4])
			if i == 0 {
				token, port = m[5], p
			} else {
				assert.Equal(t, token, m[5], "all ranks share the job token")
				assert.Equal(t, port, p, "all ranks share the port")
			}
		}
		assert.Greater(t, port, 0)
		return token, port
	}
	t1, _ := run()
	t2, _ := run()
	assert.NotEqual(t, t1, t2, "every job draws a fresh token")
}

func TestMultiNodeWithoutTokenFailsBeforeStarting(t *testing.T) {
	dir := t.TempDir()
	o := Options{NProc: 1, NNodes: 2, MasterPort: 29500, Env: baseEnv()}
	_, _, err := runSh(t, o, "touch "+dir+"/started")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "TINYACC_JOB_TOKEN is not set; with --nnodes 2")
	assert.NoFileExists(t, filepath.Join(dir, "started"))
}

func TestOutputIsPrefixedPerLineWithoutInterleaving(t *testing.T) {
	const n, lines = 4, 300
	script := fmt.Sprintf(`pad=$(printf '%%0300d' 0); i=0
while [ $i -lt %d ]; do echo "r$RANK-out-$i-$pad"; echo "r$RANK-err-$i-$pad" >&2; i=$((i+1)); done
printf "r$RANK-partial"`, lines)
	stdout, stderr, err := runSh(t, Options{NProc: n}, script)
	require.NoError(t, err)
	pad := strings.Repeat("0", 300)
	check := func(stream, text string) {
		next := make([]int, n) // per rank: the line number expected next
		partial := make([]bool, n)
		re := regexp.MustCompile(`^\[rank (\d)\] r(\d)-` + stream + `-(\d+)-` + pad + `$`)
		for _, l := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
			if m := regexp.MustCompile(`^\[rank (\d)\] r(\d)-partial$`).FindStringSubmatch(l); m != nil {
				require.Equal(t, "out", stream, "the partial line was printed to stdout")
				require.Equal(t, m[1], m[2])
				r, _ := strconv.Atoi(m[1])
				require.Equal(t, lines, next[r], "the partial line comes last")
				partial[r] = true
				continue
			}
			m := re.FindStringSubmatch(l)
			require.NotNil(t, m, "%s line is mangled or interleaved: %.80q", stream, l)
			require.Equal(t, m[1], m[2], "prefix names the rank that printed the line")
			r, _ := strconv.Atoi(m[1])
			i, _ := strconv.Atoi(m[3])
			require.Equal(t, next[r], i, "rank %d's %s lines stay in order", r, stream)
			next[r]++
		}
		for r := 0; r < n; r++ {
			assert.Equal(t, lines, next[r], "rank %d %s line count", r, stream)
			assert.Equal(t, stream == "out", partial[r], "rank %d partial line on %s", r, stream)
		}
	}
	check("out", stdout)
	check("err", stderr)
}

func TestFailingRankStopsTheJob(t *testing.T) {
	script := `if [ "$RANK" = 2 ]; then echo "loading"; echo "last words" >&2; exit 3; fi; sleep 60`
	start := time.Now()
	_, stderr, err := runSh(t, Options{NProc: 4}, script)
	elapsed := time.Since(start)
	var re *RankError
	require.ErrorAs(t, err, &re)
	assert.Less(t, elapsed, 5*time.Second, "ranks sleeping 60 s must be stopped, within 5 s")
	assert.Equal(t, 2, re.Rank)
	assert.Equal(t, 3, re.Code)
	assert.Equal(t, syscall.Signal(0), re.Signal)
	assert.Equal(t, []int{0, 1, 3}, re.Stopped)
	assert.Equal(t, 0, re.Restarts)
	assert.Equal(t, 3, ExitCode(err))
	// Both streams feed the tail; their relative order is up to the
	// scheduler, as it would be on a terminal.
	assert.ElementsMatch(t, []string{"loading", "last words"}, re.Tail)
	assert.Contains(t, []string{
		"launch: rank 2 exited with status 3 (first failure); stopped ranks [0 1 3]\nrank 2 last output:\n  loading\n  last words",
		"launch: rank 2 exited with status 3 (first failure); stopped ranks [0 1 3]\nrank 2 last output:\n  last words\n  loading",
	}, err.Error())
	assert.Equal(t, "[rank 2] last words\n", stderr)
}

func TestRankKilledBySignalIsNamed(t *testing.T) {
	script := `if [ "$RANK" = 1 ]; then echo "about to die"; kill -KILL $$; fi; sleep 60`
	_, _, err := runSh(t, Options{NProc: 2}, script)
	var re *RankError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, syscall.SIGKILL, re.Signal)
	assert.Equal(t, 137, ExitCode(err))
	assert.Equal(t, "launch: rank 1 was killed by signal SIGKILL (first failure); stopped ranks [0]\n"+
		"rank 1 last output:\n  about to die", err.Error())
}

func TestStoppingARankKillsItsChildren(t *testing.T) {
	for _, tc := range []struct {
		name, trap string
		grace      time.Duration
	}{
		{"child that obeys SIGTERM", "", 0},
		// trap '' makes the shell and its children ignore SIGTERM, so only
		// the SIGKILL after the grace period can stop them.
		{"child that ignores SIGTERM", "trap '' TERM;", 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pidFile := filepath.Join(t.TempDir(), "pid")
			script := fmt.Sprintf(`if [ "$RANK" = 0 ]; then %s sleep 60 & echo $! > %s; wait; fi
while [ ! -s %s ]; do sleep 0.01; done; exit 3`, tc.trap, pidFile, pidFile)
			_, _, err := runSh(t, Options{NProc: 2, StopGrace: tc.grace}, script)
			var re *RankError
			require.ErrorAs(t, err, &re)
			assert.Equal(t, 1, re.Rank)
			raw, rerr := os.ReadFile(pidFile)
			require.NoError(t, rerr)
			pid, perr := strconv.Atoi(strings.TrimSpace(string(raw)))
			require.NoError(t, perr)
			assert.True(t, processGone(pid), "grandchild %d of rank 0 must be gone when Run returns", pid)
		})
	}
}

// A rank stopped with SIGSTOP cannot act on SIGTERM. When another rank
// fails, the launcher kills it at once instead of waiting out the grace
// period (here 60 s) for it: the job ends at its peers' failure, not a
// grace period later.
func TestStoppedRankIsKilledAtOnceWhenTheJobFails(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	script := fmt.Sprintf(`if [ "$RANK" = 0 ]; then echo $$ > %[1]s.tmp; mv %[1]s.tmp %[1]s; kill -STOP $$; exit 0; fi
while [ ! -s %[1]s ]; do sleep 0.01; done
while ! grep -q ') T ' /proc/$(cat %[1]s)/stat; do sleep 0.01; done; exit 3`, pidFile)
	const grace = 60 * time.Second
	start := time.Now()
	_, _, err := runSh(t, Options{NProc: 2, StopGrace: grace}, script)
	elapsed := time.Since(start)
	var re *RankError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, 1, re.Rank)
	assert.Equal(t, []int{0}, re.Stopped)
	// An upper bound with a wide margin, not a timing: without the kill the
	// launcher waits the whole grace.
	assert.Less(t, elapsed, grace/2, "the stopped rank must be killed at once, not after the %s grace", grace)
	raw, rerr := os.ReadFile(pidFile)
	require.NoError(t, rerr)
	pid, perr := strconv.Atoi(strings.TrimSpace(string(raw)))
	require.NoError(t, perr)
	assert.True(t, processGone(pid), "stopped rank 0 (pid %d) must be gone when Run returns", pid)
}

func TestRestartsThenFails(t *testing.T) {
	// Rank 1 fails only once rank 0 has printed, so every attempt's output
	// is complete.
	dir := t.TempDir()
	script := fmt.Sprintf(`echo "attempt $TINYACC_RESTART"; m=%s/r0-$TINYACC_RESTART
if [ "$RANK" = 0 ]; then touch $m; sleep 60; fi
while [ ! -e $m ]; do sleep 0.01; done; exit 4`, dir)
	stdout, stderr, err := runSh(t, Options{NProc: 2, MaxRestarts: 2}, script)
	var re *RankError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, 2, re.Restarts)
	assert.Equal(t, 4, ExitCode(err))
	assert.True(t, strings.HasPrefix(err.Error(),
		"launch: rank 1 exited with status 4 (first failure, after 2 restarts); stopped ranks [0]\n"), err.Error())
	assert.Equal(t, []string{
		"launch: rank 1 exited with status 4; stopped ranks [0]; restarting the job (restart 1 of 2)",
		"launch: rank 1 exited with status 4; stopped ranks [0]; restarting the job (restart 2 of 2)",
	}, strings.Split(strings.TrimSuffix(stderr, "\n"), "\n"))
	assert.Equal(t, []string{
		"[rank 0] attempt 0", "[rank 0] attempt 1", "[rank 0] attempt 2",
		"[rank 1] attempt 0", "[rank 1] attempt 1", "[rank 1] attempt 2",
	}, sortedLines(stdout))
}

func TestRestartRecovers(t *testing.T) {
	script := `if [ "$TINYACC_RESTART" = 0 ]; then [ "$RANK" = 0 ] && exit 5; sleep 60; fi; echo "done $TINYACC_RESTART"`
	stdout, stderr, err := runSh(t, Options{NProc: 2, MaxRestarts: 3}, script)
	require.NoError(t, err)
	assert.Equal(t, "launch: rank 0 exited with status 5; stopped ranks [1]; restarting the job (restart 1 of 3)\n", stderr)
	assert.Equal(t, []string{"[rank 0] done 1", "[rank 1] done 1"}, sortedLines(stdout))
}

// readyWriter collects output and closes ready once n lines "ready" have
// arrived, so a test knows every rank has set up its signal handler.
type readyWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	n     int
	ready chan struct{}
}

func (w *readyWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if strings.HasSuffix(string(p), "] ready\n") {
		if w.n--; w.n == 0 {
			close(w.ready)
		}
	}
	return w.buf.Write(p)
}

func (w *readyWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func startWaiting(t *testing.T, ctx context.Context, o Options) (*readyWriter, <-chan error) {
	w := &readyWriter{n: o.NProc, ready: make(chan struct{})}
	o.Stdout, o.Stderr, o.Env = w, w, baseEnv()
	script := `trap 'echo "got INT"; exit 0' INT; trap 'echo "got TERM"; exit 0' TERM; echo ready
while :; do sleep 0.05; done`
	done := make(chan error, 1)
	go func() { done <- Run(ctx, o, sh(script)) }()
	select {
	case <-w.ready:
	case err := <-done:
		t.Fatalf("job ended before all ranks were ready: %v\n%s", err, w.String())
	case <-time.After(10 * time.Second):
		t.Fatalf("ranks did not report ready:\n%s", w.String())
	}
	return w, done
}

func TestLauncherSignalIsForwarded(t *testing.T) {
	sigs := make(chan os.Signal, 1)
	w, done := startWaiting(t, context.Background(), Options{NProc: 2, Signals: sigs})
	sigs <- syscall.SIGINT
	err := <-done
	var ie *InterruptedError
	require.ErrorAs(t, err, &ie)
	assert.Equal(t, "launch: received SIGINT; forwarded it to ranks [0 1] and stopped them", err.Error())
	assert.Equal(t, 130, ExitCode(err))
	assert.Contains(t, w.String(), "[rank 0] got INT\n")
	assert.Contains(t, w.String(), "[rank 1] got INT\n")
}

func TestCanceledContextStopsRanks(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	w, done := startWaiting(t, ctx, Options{NProc: 2})
	cancel()
	err := <-done
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, "launch: stopped ranks [0 1]: context canceled", err.Error())
	assert.Contains(t, w.String(), "[rank 1] got TERM\n")
}

func TestProgramThatCannotStart(t *testing.T) {
	err := Run(context.Background(), Options{NProc: 2, Env: baseEnv()}, []string{"/nonexistent/prog"})
	require.Error(t, err)
	assert.ErrorIs(t, err, os.ErrNotExist)
	assert.Contains(t, err.Error(), `launch: starting rank 0 ("/nonexistent/prog"): `)
}

func TestMainReturnsFailingRanksCode(t *testing.T) {
	var out, errb bytes.Buffer
	m := filepath.Join(t.TempDir(), "printed")
	script := fmt.Sprintf(`echo "hi $RANK"; if [ "$RANK" = 0 ]; then touch %s; sleep 60; fi
while [ ! -e %s ]; do sleep 0.01; done; exit 7`, m, m)
	code := Main([]string{"--nproc", "2", "--", "/bin/sh", "-c", script}, &out, &errb)
	assert.Equal(t, 7, code)
	assert.Equal(t, []string{"[rank 0] hi 0", "[rank 1] hi 1"}, sortedLines(out.String()))
	assert.Equal(t, "launch: rank 1 exited with status 7 (first failure); stopped ranks [0]\nrank 1 last output:\n  hi 1\n", errb.String())
}

func TestMainForwardsItsOwnSIGTERM(t *testing.T) {
	w := &readyWriter{n: 2, ready: make(chan struct{})}
	script := `trap 'echo "got TERM"; exit 0' TERM; echo ready; while :; do sleep 0.05; done`
	code := make(chan int, 1)
	go func() { code <- Main([]string{"--nproc", "2", "--", "/bin/sh", "-c", script}, w, w) }()
	select {
	case <-w.ready: // Main installed its handler before starting any rank
	case <-time.After(10 * time.Second):
		t.Fatalf("ranks did not report ready:\n%s", w.String())
	}
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGTERM))
	assert.Equal(t, 128+int(syscall.SIGTERM), <-code)
	assert.Contains(t, w.String(), "[rank 0] got TERM\n")
	assert.Contains(t, w.String(), "launch: received SIGTERM; forwarded it to ranks [0 1] and stopped them\n")
}
