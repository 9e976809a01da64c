package launch

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every torchrun spelling sets what the launcher's own flag sets.
func TestTorchrunSpellingsMapToTheLaunchersFlags(t *testing.T) {
	want := Options{NProc: 2, NNodes: 2, NodeRank: 1, MasterAddr: "10.0.0.1", MasterPort: 29500, MaxRestarts: 3, StopGrace: DefaultStopGrace}
	for _, args := range [][]string{
		{"--nproc_per_node", "2", "--nnodes", "2", "--node_rank", "1", "--master_addr", "10.0.0.1", "--master_port", "29500", "--max_restarts", "3"},
		{"--nproc-per-node=2", "--nnodes=2", "--node-rank=1", "--master-addr=10.0.0.1", "--master-port=29500", "--max-restarts=3"},
		{"--nproc_per_node=2", "--nnodes=2:2", "--node_rank=1", "--rdzv_endpoint=10.0.0.1:29500", "--rdzv_backend=c10d", "--rdzv_id=job7", "--max_restarts=3"},
		{"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "10.0.0.1:29500", "--rdzv-backend", "static", "--rdzv-id", "x", "--max-restarts", "3"},
	} {
		o, argv, err := ParseArgs(append(args, "--", "prog", "-x"))
		require.NoError(t, err, "%q", args)
		assert.Equal(t, want, o, "%q", args)
		assert.Equal(t, []string{"prog", "-x"}, argv)
	}
	o, _, err := ParseArgs([]string{"--standalone", "--nproc_per_node", "4", "--", "p"})
	require.NoError(t, err)
	assert.Equal(t, Options{NProc: 4, NNodes: 1, MasterAddr: DefaultMasterAddr, StopGrace: DefaultStopGrace}, o)
}

// A .py script given first runs with --python (default /usr/bin/python3);
// its own flags, "--" and "--help" included, are its own.
func TestScriptRunsWithPython(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "train.py")
	require.NoError(t, os.WriteFile(script, []byte("print(1)\n"), 0o644))

	o, argv, err := ParseArgs([]string{"--nproc_per_node", "2", script, "--lr", "3", "--", "--help"})
	require.NoError(t, err)
	assert.Equal(t, 2, o.NProc)
	assert.Equal(t, []string{"/usr/bin/python3", script, "--lr", "3", "--", "--help"}, argv)

	_, argv, err = ParseArgs([]string{"--python", "/opt/py/bin/python", script})
	require.NoError(t, err)
	assert.Equal(t, []string{"/opt/py/bin/python", script}, argv)

	_, argv, err = ParseArgs([]string{"--", script, "x"})
	require.NoError(t, err)
	assert.Equal(t, []string{script, "x"}, argv, "after -- the program runs as given")
}

func TestTorchrunRefusals(t *testing.T) {
	log := `every rank's output lines come prefixed with its rank on the launcher's stdout and stderr; redirect those`
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--nnodes", "1:4", "--", "p"}, "launch: --nnodes 1:4 is an elastic range; the number of nodes is fixed: give one number"},
		{[]string{"--nproc_per_node", "auto", "--", "p"}, "launch: --nproc_per_node auto is not a number; give a count"},
		{[]string{"--rdzv_endpoint", "node01", "--", "p"}, "launch: --rdzv_endpoint node01 is not HOST:PORT"},
		{[]string{"--rdzv_backend", "etcd", "--", "p"}, "launch: --rdzv_backend etcd is not supported: the rendezvous is rank 0's --master_addr:--master_port (static or c10d)"},
		{[]string{"--rdzv_conf", "timeout=9", "--", "p"}, "launch: torchrun's --rdzv_conf is not supported: the rendezvous has no options; drop the flag"},
		{[]string{"--monitor-interval", "5", "--", "p"}, "launch: torchrun's --monitor_interval is not supported: the launcher watches its ranks continuously; drop the flag"},
		{[]string{"--start_method", "fork", "--", "p"}, "launch: torchrun's --start_method is not supported: every rank is a process of its own; drop the flag"},
		{[]string{"--role", "trainer", "--", "p"}, "launch: torchrun's --role is not supported: all ranks run the same program; drop the flag"},
		{[]string{"--log_dir", "/tmp/l", "--", "p"}, "launch: torchrun's --log_dir is not supported: " + log},
		{[]string{"--redirects", "3", "--", "p"}, "launch: torchrun's --redirects is not supported: " + log},
		{[]string{"-r", "3", "--", "p"}, "launch: torchrun's -r is not supported: " + log},
		{[]string{"--tee", "3", "--", "p"}, "launch: torchrun's --tee is not supported: " + log},
		{[]string{"-t", "3", "--", "p"}, "launch: torchrun's -t is not supported: " + log},
		{[]string{"--local-ranks-filter", "0", "--", "p"}, "launch: torchrun's --local_ranks_filter is not supported: every rank's output lines come prefixed with its rank on the launcher's stdout and stderr; filter those"},
		{[]string{"--local_addr", "10.0.0.2", "--", "p"}, "launch: torchrun's --local_addr is not supported: each rank finds its own address on the network that reaches rank 0; drop the flag"},
		{[]string{"--logs_specs", "x", "--", "p"}, "launch: torchrun's --logs_specs is not supported: drop the flag"},
		{[]string{"--run_path", "train.py"}, "launch: torchrun's --run_path is not supported: give the script: tinyacc launch [flags] SCRIPT.py [ARGS...]"},
		{[]string{"--no_python", "./prog"}, `launch: torchrun's --no_python is not supported: put the program after "--": tinyacc launch [flags] -- PROGRAM [ARGS...]`},
		{[]string{"--no-python", "./prog"}, `launch: torchrun's --no_python is not supported: put the program after "--": tinyacc launch [flags] -- PROGRAM [ARGS...]`},
		{[]string{"-m", "pkg.train"}, `launch: torchrun's -m is not supported: put the module after "--": tinyacc launch [flags] -- python3 -m MODULE [ARGS...]`},
		{[]string{"--module", "pkg.train"}, `launch: torchrun's --module is not supported: put the module after "--": tinyacc launch [flags] -- python3 -m MODULE [ARGS...]`},
		{[]string{"--nproc_per_node", "2", "missing.py"}, "launch: script missing.py: no such file"},
		{[]string{"--nproc_per_node", "2", "./prog", "--x"}, `launch: "./prog" is not a .py script; put a program after "--": tinyacc launch [flags] -- ./prog`},
	} {
		_, _, err := ParseArgs(tc.args)
		assert.EqualError(t, err, tc.want, "args %q", tc.args)
	}
}
