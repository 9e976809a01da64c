package comm

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReadEnvClusterLaunchers(t *testing.T) {
	cases := []struct {
		name string
		env  []string
		want EnvInfo
	}{
		{"srun takes the master from the step's first node",
			[]string{"SLURM_PROCID=3", "SLURM_NTASKS=4", "SLURM_LOCALID=1", "SLURM_STEP_NUM_NODES=2", "SLURM_STEP_NODELIST=cn[007-008]", "TINYACC_JOB_TOKEN=t"},
			EnvInfo{Rank: 3, Size: 4, LocalRank: 1, MasterAddr: "cn007", MasterVar: "SLURM_STEP_NODELIST", Hosts: 2, MasterPort: 29500, Token: "t", Source: "slurm"}},
		{"MASTER_ADDR wins over the node list",
			[]string{"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_STEP_NODELIST=cn1,cn2", "MASTER_ADDR=10.1.0.9"},
			EnvInfo{Rank: 0, Size: 2, MasterAddr: "10.1.0.9", MasterVar: "MASTER_ADDR", MasterPort: 29500, Source: "slurm"}},
		{"mpirun inside a Slurm allocation is Open MPI's job",
			[]string{"SLURM_PROCID=0", "SLURM_NTASKS=1", "OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_RANK=0", "OMPI_COMM_WORLD_LOCAL_SIZE=2", "MASTER_ADDR=cn1"},
			EnvInfo{Rank: 2, Size: 4, LocalSize: 2, MasterAddr: "cn1", MasterVar: "MASTER_ADDR", Hosts: 2, MasterPort: 29500, Source: "openmpi"}},
		{"MPICH's hydra sets PMI",
			[]string{"PMI_RANK=1", "PMI_SIZE=2", "MPI_LOCALRANKID=1", "MPI_LOCALNRANKS=2"},
			EnvInfo{Rank: 1, Size: 2, LocalRank: 1, LocalSize: 2, MasterAddr: "127.0.0.1", MasterPort: 29500, Source: "pmi"}},
		{"srun with Open MPI's PMIx: both agree",
			[]string{"SLURM_PROCID=1", "SLURM_NTASKS=2", "OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2"},
			EnvInfo{Rank: 1, Size: 2, LocalRank: 1, MasterAddr: "127.0.0.1", MasterPort: 29500, Source: "openmpi"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ReadEnv(c.env)
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
}

func TestReadEnvInconsistentLaunchers(t *testing.T) {
	_, err := ReadEnv([]string{"RANK=0", "WORLD_SIZE=4", "OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=4"})
	assert.EqualError(t, err, "comm: inconsistent launcher variables: RANK=0 WORLD_SIZE=4 but OMPI_COMM_WORLD_RANK=2 OMPI_COMM_WORLD_SIZE=4; start the job with one launcher and unset the other's variables")
	_, err = ReadEnv([]string{"PMI_RANK=1", "PMI_SIZE=2", "SLURM_PROCID=0", "SLURM_NTASKS=2"})
	assert.EqualError(t, err, "comm: inconsistent launcher variables: PMI_RANK=1 PMI_SIZE=2 but SLURM_PROCID=0 SLURM_NTASKS=2; start the job with one launcher and unset the other's variables")
	_, err = ReadEnv([]string{"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_STEP_NODELIST=cn[x-y]"})
	assert.EqualError(t, err, `comm: SLURM_STEP_NODELIST="cn[x-y]": range "[x-y]" does not start with a number; set MASTER_ADDR to rank 0's host`)
}

// A tcp job over several hosts without a rendezvous address is refused
// before any connection, naming the variables that say it spans hosts.
func TestTCPSpanningHostsNeedsMaster(t *testing.T) {
	info, err := ReadEnv([]string{"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_SIZE=2"})
	require.NoError(t, err)
	_, err = newTCPFromEnv(info, Options{})
	assert.EqualError(t, err, "comm: the ranks span several hosts (OMPI_COMM_WORLD_LOCAL_SIZE=2 of OMPI_COMM_WORLD_SIZE=4) but MASTER_ADDR is not set; set MASTER_ADDR to rank 0's host for the tcp backend (mpirun -x MASTER_ADDR=... passes it on), or use comm.backend=mpi")
}

func TestFirstHost(t *testing.T) {
	for list, want := range map[string]string{
		"cn01": "cn01", "cn01,cn02": "cn01", "node[07-09,12],gpu3": "node07", "node[3,5]": "node3", "a[001]": "a001",
	} {
		got, err := firstHost(list)
		require.NoError(t, err, list)
		assert.Equal(t, want, got, list)
	}
	for _, bad := range []string{"", ",cn1", "cn[1-2", "cn[]"} {
		_, err := firstHost(bad)
		assert.Error(t, err, bad)
	}
}
