package comm

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReadEnv(t *testing.T) {
	cases := []struct {
		name string
		env  []string
		want EnvInfo
	}{
		{"nothing is a world of one", nil,
			EnvInfo{Rank: 0, Size: 1, MasterAddr: "127.0.0.1", MasterPort: 29500, Source: "single"}},
		{"torchrun", []string{"RANK=3", "WORLD_SIZE=4", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=10.0.0.5", "MASTER_PORT=1234", "TINYACC_JOB_TOKEN=s3cret", "TINYACC_DEBUG=detail", "TINYACC_COMM_TIMEOUT=30s"}, // not read here: comm.timeout is the one deadline
			EnvInfo{Rank: 3, Size: 4, LocalRank: 1, LocalSize: 2, MasterAddr: "10.0.0.5", MasterVar: "MASTER_ADDR", Hosts: 2, MasterPort: 1234, Token: "s3cret", Source: "torchrun", Debug: true}},
		{"slurm", []string{"SLURM_PROCID=5", "SLURM_NTASKS=8", "SLURM_LOCALID=1", "MASTER_ADDR=node1"},
			EnvInfo{Rank: 5, Size: 8, LocalRank: 1, MasterAddr: "node1", MasterVar: "MASTER_ADDR", MasterPort: 29500, Source: "slurm"}},
		{"open mpi", []string{"OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=3", "OMPI_COMM_WORLD_LOCAL_RANK=2", "OMPI_COMM_WORLD_LOCAL_SIZE=3"},
			EnvInfo{Rank: 2, Size: 3, LocalRank: 2, LocalSize: 3, MasterAddr: "127.0.0.1", MasterPort: 29500, Source: "openmpi"}},
		{"torchrun wins over slurm", []string{"SLURM_PROCID=5", "SLURM_NTASKS=8", "RANK=0", "WORLD_SIZE=2"},
			EnvInfo{Rank: 0, Size: 2, LocalRank: 0, MasterAddr: "127.0.0.1", MasterPort: 29500, Source: "torchrun"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ReadEnv(c.env)
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
}

func TestReadEnvErrors(t *testing.T) {
	cases := map[string][]string{
		`comm: RANK="x" is not an integer`:                                                                                            {"RANK=x", "WORLD_SIZE=2"},
		`comm: rank 2 is outside a world of size 2 (from torchrun)`:                                                                   {"RANK=2", "WORLD_SIZE=2"},
		`comm: RANK and WORLD_SIZE must be set together (found only one)`:                                                             {"RANK=0"},
		`comm: MASTER_PORT=70000 is not a valid port (1-65535)`:                                                                       {"MASTER_PORT=70000"},
		`comm: TINYACC_DEBUG="yes": use "detail" or leave it unset`:                                                                   {"TINYACC_DEBUG=yes"},
		`comm: SLURM_NTASKS=0: the world size must be at least 1 (from slurm)`:                                                        {"SLURM_PROCID=0", "SLURM_NTASKS=0"},
		`comm: WORLD_SIZE=0: the world size must be at least 1 (from torchrun)`:                                                       {"RANK=0", "WORLD_SIZE=0"},
		`comm: WORLD_SIZE=-2: the world size must be at least 1 (from torchrun)`:                                                      {"RANK=0", "WORLD_SIZE=-2"},
		`comm: LOCAL_RANK=2 is outside LOCAL_WORLD_SIZE=2: local ranks on a host are 0 to 1 (from torchrun)`:                          {"RANK=2", "WORLD_SIZE=4", "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"},
		`comm: LOCAL_RANK=-1: a local rank is at least 0 (from torchrun)`:                                                             {"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=-1"},
		`comm: LOCAL_WORLD_SIZE=0: the ranks on one host number at least 1 (from torchrun)`:                                           {"RANK=1", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=0"},
		`comm: LOCAL_WORLD_SIZE=4 is more than WORLD_SIZE=2: a host cannot run more ranks than the job has (from torchrun)`:           {"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=4"},
		`comm: OMPI_COMM_WORLD_LOCAL_RANK=3 is outside OMPI_COMM_WORLD_LOCAL_SIZE=2: local ranks on a host are 0 to 1 (from openmpi)`: {"OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_RANK=3", "OMPI_COMM_WORLD_LOCAL_SIZE=2"},
	}
	for want, env := range cases {
		_, err := ReadEnv(env)
		assert.EqualError(t, err, want)
	}
}
