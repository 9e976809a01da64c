//go:build linux

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// `mpirun -np 2 tinyacc train` with no tinyacc launch in between: on the mpi
// backend (DDP bucketed, ZeRO-3) and on the tcp backend (rendezvous on
// loopback, as mpirun on one host gives no MASTER_ADDR), losses match one
// process with the same global batch. The mpi backend is Linux's, as are
// the train flags it shares with the namespace tests (netnsTrain).
func TestTrainUnderMpirun(t *testing.T) {
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		t.Skip("mpirun is not installed (make deps installs openmpi-bin)")
	}
	bin := tinyaccBinary(t)
	dir := t.TempDir()
	args := append(append([]string{}, netnsTrain...), "--train.steps=4")
	single := filepath.Join(dir, "single.jsonl")
	cmd := exec.Command(bin, append(args, "--train.batch_size=8", "--metrics_file="+single)...)
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	want := trainLosses(t, single)
	for _, v := range [][]string{
		{"--comm.backend=mpi", "--zero.stage=0", "--ddp.mode=bucketed"},
		{"--comm.backend=mpi", "--zero.stage=3"},
		{"--comm.backend=tcp", "--zero.stage=0"},
	} {
		metrics := filepath.Join(dir, "mpirun.jsonl")
		full := append([]string{"--allow-run-as-root", "--oversubscribe", "-np", "2", bin}, args...)
		full = append(append(full, "--train.batch_size=4", "--comm.timeout=60s", "--metrics_file="+metrics), v...)
		cmd := exec.Command(mpirun, full...)
		cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1", "TINYACC_JOB_TOKEN=mpirun-test")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%v:\n%s", v, out)
		got := trainLosses(t, metrics)
		require.Len(t, got, len(want), "%v", v)
		for i := range want {
			require.InEpsilon(t, want[i], got[i], 1e-5, "%v: loss of step %d", v, i)
		}
	}
}
