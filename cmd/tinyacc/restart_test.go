package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

var built struct {
	sync.Once
	path string
	err  error
}

// tinyaccBinary builds the command once per test run.
func tinyaccBinary(t *testing.T) string {
	built.Do(func() {
		dir, err := os.MkdirTemp("", "tinyacc-bin-")
		if err != nil {
			built.err = err
			return
		}
		built.path = filepath.Join(dir, "tinyacc")
		if out, err := exec.Command("go", "build", "-o", built.path, ".").CombinedOutput(); err != nil {
			built.err = fmt.Errorf("%v: %s", err, out)
		}
	})
	require.NoError(t, built.err)
	return built.path
}

// smallRun is a tiny model that trains in a few milliseconds a step.
func smallRun(steps int, extra ...string) []string {
	return append([]string{"train", "--model.n_layer=2", "--model.n_embd=32", "--model.block_size=32",
		"--train.steps=" + strconv.Itoa(steps), "--train.eval_every=0", "--data.max_bytes=200000",
		"--data.val_fraction=0", "--train.batch_size=2"}, extra...)
}

// runUntil starts bin with args, calls at(cmd, line) for every line of its
// output, and returns the exit code and the whole output.
func runUntil(t *testing.T, bin string, args []string, at func(cmd *exec.Cmd, line string)) (int, string) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	require.NoError(t, cmd.Start())
	var out bytes.Buffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if at != nil {
				at(cmd, sc.Text())
			}
		}
		io.Copy(io.Discard, pr)
	}()
	err := cmd.Wait()
	pw.Close()
	<-done
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), out.String()
}

// TestSIGTERMToTheLauncherCheckpoints: SIGTERM to `train --nproc 2` in the
// middle of training makes every rank finish the same step and write a
// checkpoint; resuming from it ends with the weights of a run that was
// never stopped, byte for byte.
func TestSIGTERMToTheLauncherCheckpoints(t *testing.T) {
	bin := tinyaccBinary(t)
	dir := t.TempDir()
	ckptDir := filepath.Join(dir, "ckpt")
	const steps = 60
	whole := filepath.Join(dir, "whole.safetensors")
	code, out := runUntil(t, bin, smallRun(steps, "--nproc", "2", "--save_to="+whole), nil)
	require.Equal(t, 0, code, out)

	var once sync.Once
	metrics := filepath.Join(dir, "metrics.jsonl")
	code, out = runUntil(t, bin, smallRun(steps, "--nproc", "2", "--checkpoint.dir="+ckptDir, "--metrics_file="+metrics), func(cmd *exec.Cmd, line string) {
		if strings.Contains(line, "step 10/") {
			once.Do(func() { cmd.Process.Signal(syscall.SIGTERM) })
		}
	})
	require.Equal(t, 143, code, out)
	require.Contains(t, out, "interrupted after ")
	require.Contains(t, out, "the training state is in "+ckptDir)
	latest, err := os.ReadFile(filepath.Join(ckptDir, "latest"))
	require.NoError(t, err)
	stoppedAt, err := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(string(latest)), "step-"))
	require.NoError(t, err)
	require.Greater(t, stoppedAt, 9)
	require.Less(t, stoppedAt, steps, "the run must have been stopped before its end")

	resumed := filepath.Join(dir, "resumed.safetensors")
	code, out = runUntil(t, bin, smallRun(steps, "--nproc", "2", "--resume="+ckptDir, "--save_to="+resumed, "--metrics_file="+metrics), nil)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, fmt.Sprintf("%d of %d steps done", stoppedAt, steps))
	a, err := os.ReadFile(whole)
	require.NoError(t, err)
	b, err := os.ReadFile(resumed)
	require.NoError(t, err)
	require.True(t, bytes.Equal(a, b), "resumed weights differ from the uninterrupted run's")
	require.Equal(t, stepsUpTo(steps), trainRows(t, metrics), "metrics_file must hold every step of the stopped and the resumed run once")
}

// TestKilledRankRestarts kills one of 4 ranks with SIGKILL at a random
// step of `train --nproc 4 --max-restarts 1`: the launcher restarts the
// job, the ranks resume from the latest checkpoint by themselves, and the
// final weights are those of the uninterrupted run, byte for byte.
func TestKilledRankRestarts(t *testing.T) {
	bin := tinyaccBinary(t)
	dir := t.TempDir()
	const steps = 40
	common := []string{"--nproc", "4", "--checkpoint.every=2", "--train.batch_size=1", "--model.n_embd=64"}
	whole := filepath.Join(dir, "whole.safetensors")
	code, out := runUntil(t, bin, smallRun(steps, append(common, "--checkpoint.dir="+filepath.Join(dir, "a"), "--save_to="+whole)...), nil)
	require.Equal(t, 0, code, out)

	killAt := 3 + rand.Intn(steps/2)
	victim := 1 + rand.Intn(3)
	var once sync.Once
	var killErr error
	restarted := filepath.Join(dir, "restarted.safetensors")
	metrics := filepath.Join(dir, "metrics.jsonl")
	args := smallRun(steps, append(common, "--checkpoint.dir="+filepath.Join(dir, "b"), "--save_to="+restarted, "--max-restarts", "1", "--metrics_file="+metrics)...)
	code, out = runUntil(t, bin, args, func(cmd *exec.Cmd, line string) {
		if strings.Contains(line, fmt.Sprintf("step %2d/%d", killAt, steps)) || strings.Contains(line, fmt.Sprintf("step %d/%d", killAt, steps)) {
			once.Do(func() { killErr = killRank(cmd.Process.Pid, victim) })
		}
	})
	require.NoError(t, killErr)
	require.Equal(t, 0, code, "killed rank %d at step %d:\n%s", victim, killAt, out)
	require.Contains(t, out, "resumed from ", "the ranks must have resumed after the restart:\n%s", out)
	a, err := os.ReadFile(whole)
	require.NoError(t, err)
	b, err := os.ReadFile(restarted)
	require.NoError(t, err)
	require.True(t, bytes.Equal(a, b), "killed rank %d at step %d: the final weights differ from the uninterrupted run's", victim, killAt)
	require.Equal(t, stepsUpTo(steps), trainRows(t, metrics), "killed rank %d at step %d: metrics_file must hold every step once", victim, killAt)
}

// trainRows returns the steps of the train rows of a metrics file, in order.
func trainRows(t *testing.T, path string) []int {
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var steps []int
	for _, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		var row struct {
			Kind string `json:"kind"`
			Step int    `json:"step"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &row), line)
		if row.Kind == "train" {
			steps = append(steps, row.Step)
		}
	}
	return steps
}

// stepsUpTo is 1..n.
func stepsUpTo(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i + 1
	}
	return out
}

// killRank sends SIGKILL to the rank process with RANK=rank among the
// children of the launcher (started from any of its threads).
func killRank(launcher, rank int) error { return signalRank(launcher, rank, syscall.SIGKILL) }

// signalRank sends sig to the rank process with RANK=rank among the
// children of the launcher.
func signalRank(launcher, rank int, sig syscall.Signal) error {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", launcher))
	for _, task := range tasks {
		b, err := os.ReadFile(task)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			pid, _ := strconv.Atoi(f)
			env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
			if err != nil {
				continue
			}
			for _, kv := range strings.Split(string(env), "\x00") {
				if kv == "RANK="+strconv.Itoa(rank) {
					return syscall.Kill(pid, sig)
				}
			}
		}
	}
	return fmt.Errorf("no child of %d has RANK=%d", launcher, rank)
}
