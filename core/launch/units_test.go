package launch

import (
	"bytes"
	"flag"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseArgsAccepts(t *testing.T) {
	o, argv, err := ParseArgs([]string{"--nproc", "4", "--max-restarts=2", "--stop-grace", "500ms", "--", "prog", "-x", "--", "--y"})
	require.NoError(t, err)
	assert.Equal(t, []string{"prog", "-x", "--", "--y"}, argv, "everything after the first -- belongs to the program")
	assert.Equal(t, 4, o.NProc)
	assert.Equal(t, 1, o.NNodes)
	assert.Equal(t, 0, o.NodeRank)
	assert.Equal(t, "127.0.0.1", o.MasterAddr)
	assert.Equal(t, 0, o.MasterPort)
	assert.Equal(t, 2, o.MaxRestarts)
	assert.Equal(t, 500*time.Millisecond, o.StopGrace)

	o, argv, err = ParseArgs([]string{"-nnodes=2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29500", "--", "p"})
	require.NoError(t, err)
	assert.Equal(t, []string{"p"}, argv)
	assert.Equal(t, Options{NProc: 1, NNodes: 2, NodeRank: 1, MasterAddr: "10.0.0.1", MasterPort: 29500, StopGrace: DefaultStopGrace}, o)
}

func TestParseArgsRejects(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--nproc", "0", "--", "p"}, "launch: --nproc must be at least 1, got 0"},
		{[]string{"--nproc", "2", "p"}, `launch: "p" is not a .py script; put a program after "--": tinyacc launch [flags] -- p`},
		{[]string{"--nproc", "2"}, `launch: missing "--" before the program; use tinyacc launch --nproc N -- PROGRAM [ARGS...] (or --nproc N SCRIPT.py [ARGS...])`},
		{[]string{"--nproc", "2", "--"}, `launch: no program after "--"; use tinyacc launch --nproc N -- PROGRAM [ARGS...]`},
		{[]string{"--nnodes", "2", "--node-rank", "2", "--master-port", "29500", "--", "p"}, "launch: --node-rank 2 is out of range for --nnodes 2; use 0..1"},
		{[]string{"--node-rank", "-1", "--", "p"}, "launch: --node-rank -1 is out of range for --nnodes 1; use 0..0"},
		{[]string{"--nnodes", "0", "--", "p"}, "launch: --nnodes must be at least 1, got 0"},
		{[]string{"--nnodes", "2", "--", "p"}, "launch: --master-port is required with --nnodes 2, since every node must agree on it"},
		{[]string{"--master-port", "70000", "--", "p"}, "launch: --master-port 70000 is not a TCP port; use 1..65535, or 0 to pick a free one"},
		{[]string{"--max-restarts", "-1", "--", "p"}, "launch: --max-restarts must be 0 or more, got -1"},
		{[]string{"--bogus", "--", "p"}, "launch: flag provided but not defined: -bogus"},
		{[]string{"--nproc", "x", "--", "p"}, "launch: --nproc x is not a number; give a count"},
		{[]string{"--master-port", "x", "--", "p"}, `launch: invalid value "x" for flag -master-port: parse error`},
	} {
		_, _, err := ParseArgs(tc.args)
		assert.EqualError(t, err, tc.want, "args %q", tc.args)
	}
	_, _, err := ParseArgs([]string{"--help"})
	assert.ErrorIs(t, err, flag.ErrHelp)
}

func TestMainReportsBadFlagsAndHelp(t *testing.T) {
	var out, errb bytes.Buffer
	assert.Equal(t, 2, Main([]string{"--nproc", "0", "--", "true"}, &out, &errb))
	assert.Equal(t, "launch: --nproc must be at least 1, got 0\nrun \"tinyacc launch --help\" for the flags\n", errb.String())
	assert.Empty(t, out.String())

	out.Reset()
	errb.Reset()
	assert.Equal(t, 0, Main([]string{"-h"}, &out, &errb))
	assert.Equal(t, Usage(), out.String())
	assert.Contains(t, out.String(), "--max-restarts K")
}

func TestRankEnvOverridesRendezvousKeepsUserThreads(t *testing.T) {
	base := []string{"PATH=/bin", "RANK=99", "OMP_NUM_THREADS=7", "GOMAXPROCS=", "HOME=/h", "MASTER_PORT=1"}
	o := Options{NProc: 3, NNodes: 2, NodeRank: 1, MasterAddr: "10.1.2.3"}
	env := rankEnv(base, o, rankSpec{local: 2, port: 29555, token: "tok", attempt: 4, threadsPer: 2})
	assert.Equal(t, []string{
		"PATH=/bin", "OMP_NUM_THREADS=7", "HOME=/h",
		"RANK=5", "LOCAL_RANK=2", "WORLD_SIZE=6", "LOCAL_WORLD_SIZE=3", "GROUP_RANK=1",
		"MASTER_ADDR=10.1.2.3", "MASTER_PORT=29555", "TINYACC_JOB_TOKEN=tok", "TINYACC_RESTART=4",
		// An empty GOMAXPROCS is no choice at all, so it gets the even split.
		"OPENBLAS_NUM_THREADS=2", "GOMAXPROCS=2",
	}, env)
}

func TestThreadsPerRank(t *testing.T) {
	for _, tc := range []struct{ cpus, nproc, want int }{
		{16, 4, 4}, {16, 3, 5}, {2, 4, 1}, {1, 1, 1}, {8, 8, 1}, {8, 9, 1},
	} {
		assert.Equal(t, tc.want, threadsPerRank(tc.cpus, tc.nproc), "cpus=%d nproc=%d", tc.cpus, tc.nproc)
	}
}

func TestJobToken(t *testing.T) {
	tok, err := jobToken([]string{"TINYACC_JOB_TOKEN=shared"}, 3)
	require.NoError(t, err)
	assert.Equal(t, "shared", tok, "a token the user exported is used as is")

	_, err = jobToken([]string{"TINYACC_JOB_TOKEN="}, 2)
	assert.EqualError(t, err, "launch: TINYACC_JOB_TOKEN is not set; with --nnodes 2 every node needs the same token, "+
		"e.g. export TINYACC_JOB_TOKEN=$(openssl rand -hex 32) on all nodes before launching")

	a, err := jobToken(nil, 1)
	require.NoError(t, err)
	b, err := jobToken(nil, 1)
	require.NoError(t, err)
	assert.Regexp(t, `^[0-9a-f]{64}$`, a)
	assert.NotEqual(t, a, b, "each single-node job draws its own token")
}

func TestFreePortIsListenable(t *testing.T) {
	port, err := FreePort("127.0.0.1")
	require.NoError(t, err)
	require.Greater(t, port, 0)
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	require.NoError(t, err, "the port FreePort returned must be free to bind")
	ln.Close()

	_, err = FreePort("203.0.113.7") // documentation range: never local
	require.Error(t, err)
	assert.Contains(t, err.Error(), "launch: picking a free port on 203.0.113.7 (is --master-addr an address of this host?)")
}

func TestTailKeepsLastLinesInOrder(t *testing.T) {
	tl := newTail(3)
	assert.Empty(t, tl.snapshot())
	tl.add([]byte("a"))
	tl.add([]byte("b"))
	assert.Equal(t, []string{"a", "b"}, tl.snapshot())
	for _, l := range []string{"c", "d", "e", "f", "g"} {
		tl.add([]byte(l))
	}
	assert.Equal(t, []string{"e", "f", "g"}, tl.snapshot())
	tl.add([]byte(strings.Repeat("x", maxTailLine+10)))
	assert.Equal(t, strings.Repeat("x", maxTailLine)+"...", tl.snapshot()[2])
}

func TestPumpPrefixesSplitsLongLinesAndFlushesPartial(t *testing.T) {
	var buf bytes.Buffer
	o := &output{stdout: &buf, stderr: &buf}
	long := strings.Repeat("a", maxLine+100)
	in := "one\n\ntwo\n" + long + "\nlast"
	tl := newTail(10)
	o.pump(strings.NewReader(in), &buf, "[rank 7] ", tl)
	want := "[rank 7] one\n[rank 7] \n[rank 7] two\n" +
		"[rank 7] " + strings.Repeat("a", maxLine) + "\n" +
		"[rank 7] " + strings.Repeat("a", 100) + "\n" +
		"[rank 7] last\n"
	assert.Equal(t, want, buf.String())
	snap := tl.snapshot()
	assert.Equal(t, "last", snap[len(snap)-1])
}

func TestSignalName(t *testing.T) {
	assert.Equal(t, "SIGKILL", signalName(9))
	assert.Equal(t, "SIGSEGV", signalName(11))
	assert.Equal(t, "signal 63", signalName(63))
}
