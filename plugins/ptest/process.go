package ptest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/config"
)

// The variables a rank process of Processes reads besides the launcher's:
// which Processes call it belongs to, and where it writes its result.
const (
	envRun = "TINYACC_PTEST_RUN"
	envOut = "TINYACC_PTEST_OUT"
)

// Processes trains cfg on n real processes over the tcp backend and returns
// every rank's result. The test binary runs itself once per rank with the
// launcher's variables, re-entering the calling test; there, the Processes
// call named id trains its rank, writes the result and ends the test, and
// every other Processes call of that test is skipped. So the calling test
// must reach the call the same way in a child (same id, same cfg and
// build): keep the code before it deterministic.
func Processes(t *testing.T, id string, cfg config.Config, n int, build Build) []Result {
	if run := os.Getenv(envRun); run != "" {
		if run != id {
			return nil // a child of another Processes call of this test
		}
		child(t, cfg, build)
		t.SkipNow() // the child's work is done; the parent checks it
		return nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // rank 0 binds it again
	dir := t.TempDir()
	outs := make([][]byte, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1")
		cmd.Env = append(os.Environ(),
			envRun+"="+id, envOut+"="+filepath.Join(dir, strconv.Itoa(r)+".json"),
			"RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(n),
			"LOCAL_RANK="+strconv.Itoa(r), "LOCAL_WORLD_SIZE="+strconv.Itoa(n),
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port),
			"TINYACC_JOB_TOKEN=ptest-"+id, "OMP_NUM_THREADS=1", "OPENBLAS_NUM_THREADS=1")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		require.NoError(t, cmd.Start())
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			errs[r] = cmd.Wait()
			outs[r] = out.Bytes()
		}(r)
	}
	wg.Wait()
	results := make([]Result, n)
	for r := range n {
		b, err := os.ReadFile(filepath.Join(dir, strconv.Itoa(r)+".json"))
		require.NoError(t, err, "rank %d wrote no result (exit: %v); its output:\n%s", r, errs[r], outs[r])
		require.NoError(t, json.Unmarshal(b, &results[r]), "rank %d's result", r)
	}
	return results
}

// child trains this process's rank and writes its result for the parent.
func child(t *testing.T, cfg config.Config, build Build) {
	g, err := comm.InitFromEnv(comm.Options{Timeout: timeout})
	require.NoError(t, err)
	defer g.Close()
	r, err := runRank(cfg, g, build, nil)
	require.NoError(t, err)
	b, err := json.Marshal(r)
	require.NoError(t, err)
	path := os.Getenv(envOut)
	require.NoError(t, os.WriteFile(path+".tmp", b, 0o644))
	require.NoError(t, os.Rename(path+".tmp", path), fmt.Sprintf("rank %d", g.Rank()))
}
