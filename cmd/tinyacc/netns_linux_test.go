package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/internal/netnstest"
)

// Two "hosts" on one machine (netnstest.Pair), each with its own host
// identity (TINYACC_HOST_ID) and two ranks.

// nsRank is one rank process running inside a namespace.
type nsRank struct {
	cmd *exec.Cmd
	out bytes.Buffer
}

// startNetnsJob starts 4 ranks of `tinyacc train`: ranks 0 and 1 in p.A
// (host "hostA", rank 0 hosts the store at netnstest.AddrA), ranks 2 and 3
// in p.B. stdout0, when not nil, receives rank 0's standard output as it
// comes.
func startNetnsJob(t *testing.T, ctx context.Context, bin string, p netnstest.Pair, args []string, stdout0 io.Writer) []*nsRank {
	t.Helper()
	ranks := make([]*nsRank, 4)
	for r := range ranks {
		ns, host := p.A, "hostA"
		if r >= 2 {
			ns, host = p.B, "hostB"
		}
		argv := netnstest.Exec(ns, append([]string{bin}, args...)...)
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1",
			"RANK="+strconv.Itoa(r), "WORLD_SIZE=4", "LOCAL_RANK="+strconv.Itoa(r%2), "LOCAL_WORLD_SIZE=2",
			"MASTER_ADDR="+netnstest.AddrA, "MASTER_PORT=29500", "TINYACC_JOB_TOKEN=netns-test-token",
			"TINYACC_HOST_ID="+host)
		rk := &nsRank{cmd: cmd}
		cmd.Stdout, cmd.Stderr = &rk.out, &rk.out
		if r == 0 && stdout0 != nil {
			// One writer for both streams: exec then writes from one
			// goroutine, never into the buffer concurrently.
			w := io.MultiWriter(&rk.out, stdout0)
			cmd.Stdout, cmd.Stderr = w, w
		}
		cmd.WaitDelay = 5 * time.Second
		require.NoError(t, cmd.Start())
		ranks[r] = rk
	}
	return ranks
}

func waitAll(ranks []*nsRank) []error {
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for r, rk := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = rk.cmd.Wait()
		}()
	}
	wg.Wait()
	return errs
}

var netnsTrain = []string{"train", "--model.n_layer=2", "--model.n_embd=32", "--model.block_size=32",
	"--train.eval_every=0", "--data.max_bytes=200000", "--data.val_fraction=0"}

// 2 hosts × 2 ranks of DDP over tcp match one process with the same global
// batch, and the cross-host pairs used tcp while same-host pairs shared
// memory.
func TestTrainAcrossNetnsHosts(t *testing.T) {
	p := netnstest.New(t)
	bin := tinyaccBinary(t)
	dir := t.TempDir()
	single := filepath.Join(dir, "single.jsonl")
	args := append(append([]string{}, netnsTrain...), "--train.steps=5")
	cmd := exec.Command(bin, append(args, "--train.batch_size=8", "--metrics_file="+single)...)
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	want := trainLosses(t, single)

	multi := filepath.Join(dir, "multi.jsonl")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ranks := startNetnsJob(t, ctx, bin, p, append(args, "--train.batch_size=2", "--comm.timeout=30s", "--metrics_file="+multi), nil)
	errs := waitAll(ranks)
	for r, rk := range ranks {
		require.NoError(t, errs[r], "rank %d:\n%s", r, rk.out.String())
	}
	links := []string{"[1], tcp with ranks [2 3]", "[0], tcp with ranks [2 3]", "[3], tcp with ranks [0 1]", "[2], tcp with ranks [0 1]"}
	for r, rk := range ranks {
		assert.Contains(t, rk.out.String(), fmt.Sprintf("comm: rank %d on 2 hosts: shared memory with ranks %s\n", r, links[r]))
	}
	got := trainLosses(t, multi)
	require.Len(t, got, len(want))
	for i := range want {
		assert.InEpsilon(t, want[i], got[i], 1e-5, "loss of step %d", i)
	}
}

// Dropping hostA's link in the middle of training ends every rank within
// the communication deadline, each naming the ranks on the other side.
// The drop lands on whichever all-reduce of the step is in flight: the
// gradients' (group "dp") or the gradient norm's (the world).
func TestTrainAcrossNetnsLinkDown(t *testing.T) {
	p := netnstest.New(t)
	bin := tinyaccBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pr, pw := io.Pipe()
	args := append(append([]string{}, netnsTrain...), "--train.steps=100000", "--train.batch_size=2",
		"--train.log_every=1", "--comm.timeout=3s")
	ranks := startNetnsJob(t, ctx, bin, p, args, pw)
	// Drop the link once rank 0 has logged its third step.
	dropped := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "step      3/") {
				dropped <- netnstest.IP("-n", p.A, "link", "set", p.LinkA, "down")
				break
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	errs := waitAll(ranks)
	pw.Close()
	select {
	case err := <-dropped:
		require.NoError(t, err)
	default:
		t.Fatalf("the job ended before its third step:\n%s", ranks[0].out.String())
	}
	require.NoError(t, ctx.Err(), "ranks still running 2 minutes after the link went down")
	other := [][2]int{{2, 3}, {2, 3}, {0, 1}, {0, 1}}
	for r, rk := range ranks {
		require.Error(t, errs[r], "rank %d finished despite the dropped link:\n%s", r, rk.out.String())
		a, b := other[r][0], other[r][1]
		line := regexp.MustCompile(fmt.Sprintf(`(?m)^tinyacc: rank %d: step \d+: .*comm: all_reduce on group "(?:dp|world)" seq \d+ failed after 3s: ranks \[[0-3 ]*\] did not arrive \((.*)\)$`, r)).FindStringSubmatch(rk.out.String())
		if !assert.NotNil(t, line, "rank %d:\n%s", r, rk.out.String()) {
			continue
		}
		// The same-host mate may be listed too (before or after them)
		// when it gave up first.
		for _, o := range []int{a, b} {
			assert.Contains(t, line[1], fmt.Sprintf("rank %d: no answer: timed out waiting for rank %d", o, o), "rank %d", r)
		}
	}
}
