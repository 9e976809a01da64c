package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// faultVar makes this test binary play tinyacc: the process started by the
// test runs the real command line (`train --nproc 2` and its launcher), and
// the rank processes the launcher starts from the same binary fail the way
// the variable says instead of training.
const faultVar = "CLI_TEST_FAULT"

func TestMain(m *testing.M) {
	if fault := os.Getenv(faultVar); fault != "" {
		if os.Getenv("RANK") == "" {
			os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
		}
		fakeRank(fault, os.Getenv("RANK"))
	}
	code := m.Run()
	if built.path != "" {
		os.RemoveAll(filepath.Dir(built.path))
	}
	os.Exit(code)
}

// fakeRank announces itself, then rank 1 fails as fault says; every other
// rank waits to be stopped by the launcher.
func fakeRank(fault, rank string) {
	fmt.Println("ready")
	if rank == "1" {
		switch fault {
		case "exit3":
			fmt.Println("rank one exits 3")
			os.Exit(3)
		case "kill":
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
	}
	time.Sleep(time.Hour) // until the launcher stops this rank
	os.Exit(0)
}

// trainNProc2 runs `train --nproc 2` with the given fault; after both ranks
// announced themselves it calls then (nil: nothing). It returns the exit
// code and stderr.
func trainNProc2(t *testing.T, fault string, then func(p *os.Process)) (int, string) {
	cmd := exec.Command(os.Args[0], "train", "--nproc", "2")
	cmd.Env = append(os.Environ(), faultVar+"="+fault)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	sc := bufio.NewScanner(out)
	ready := 0
	for sc.Scan() {
		if strings.HasSuffix(sc.Text(), "ready") {
			if ready++; ready == 2 && then != nil {
				then(cmd.Process)
			}
		}
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), stderr.String()
}

func TestTrainNProcExitCodes(t *testing.T) {
	code, stderr := trainNProc2(t, "exit3", nil)
	require.Equal(t, 3, code, stderr)
	require.Contains(t, stderr, "launch: rank 1 exited with status 3")

	code, stderr = trainNProc2(t, "kill", nil)
	require.Equal(t, 137, code, stderr)
	require.Contains(t, stderr, "launch: rank 1 was killed by signal SIGKILL")

	code, stderr = trainNProc2(t, "wait", func(p *os.Process) { _ = p.Signal(syscall.SIGTERM) })
	require.Equal(t, 143, code, stderr)
	require.Contains(t, stderr, "launch: received SIGTERM")
}
