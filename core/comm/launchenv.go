package comm

import (
	"fmt"
	"strings"
)

// The variables cluster launchers set, so that `mpirun -np 4 tinyacc train`
// and `srun tinyacc train` start a job without tinyacc launch in between.

// launcherScheme names the variables one launcher sets for each rank.
type launcherScheme struct {
	source, rank, size, local, localSize string
}

// launcherSchemes are in precedence order, innermost launcher first: a
// process that tinyacc launch started inside an mpirun or srun allocation
// is a rank of tinyacc launch's job, and mpirun inside a Slurm allocation
// sets its own variables next to the allocation's.
var launcherSchemes = []launcherScheme{
	{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
	{"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
	{"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
	{"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", ""},
}

// readLauncher fills the rank fields of info from the first scheme present.
// Two launchers that describe the same world (equal sizes) but put this
// process at different ranks are an inconsistent mix, for instance a RANK
// left exported in the shell that runs mpirun: refused, naming both.
// Different sizes are launchers nested in one another and are not compared.
func readLauncher(env map[string]string, info *EnvInfo, num func(string, *int) error) error {
	chosen := -1
	for i, s := range launcherSchemes {
		_, hasRank := env[s.rank]
		_, hasSize := env[s.size]
		if !hasRank && !hasSize {
			continue
		}
		if hasRank != hasSize {
			return fmt.Errorf("comm: %s and %s must be set together (found only one)", s.rank, s.size)
		}
		var rank, size int
		if err := num(s.rank, &rank); err != nil {
			return err
		}
		if err := num(s.size, &size); err != nil {
			return err
		}
		if chosen < 0 {
			chosen = i
			info.Source, info.Rank, info.Size, info.LocalRank = s.source, rank, size, rank
			if err := num(s.local, &info.LocalRank); err != nil {
				return err
			}
			if s.localSize != "" {
				if err := num(s.localSize, &info.LocalSize); err != nil {
					return err
				}
				if _, set := env[s.localSize]; set && info.LocalSize < 1 {
					return fmt.Errorf("comm: %s=%d: the ranks on one host number at least 1 (from %s)", s.localSize, info.LocalSize, s.source)
				}
			}
			continue
		}
		c := launcherSchemes[chosen]
		if size == info.Size && rank != info.Rank {
			return fmt.Errorf("comm: inconsistent launcher variables: %s=%d %s=%d but %s=%d %s=%d; start the job with one launcher and unset the other's variables",
				c.rank, info.Rank, c.size, info.Size, s.rank, rank, s.size, size)
		}
	}
	if info.Source == "slurm" {
		if err := num("SLURM_STEP_NUM_NODES", &info.Hosts); err != nil {
			return err
		}
	}
	if info.Source != "single" && info.LocalSize > 0 && info.LocalSize < info.Size {
		info.Hosts = max(info.Hosts, 2) // at least two; the launcher does not say how many
	}
	return nil
}

// schemeOf is the scheme a source name stands for.
func schemeOf(source string) launcherScheme {
	for _, s := range launcherSchemes {
		if s.source == source {
			return s
		}
	}
	return launcherScheme{source: source}
}

// checkRanks refuses rank variables that describe no job: a world of fewer
// than one process (which would otherwise train alone, as if nothing had
// been set), a rank outside its world, a local rank outside its host's.
// Errors name the variables as the launcher set them.
func checkRanks(info EnvInfo) error {
	if info.Source == "single" {
		return nil
	}
	s := schemeOf(info.Source)
	if info.Size < 1 {
		return fmt.Errorf("comm: %s=%d: the world size must be at least 1 (from %s)", s.size, info.Size, info.Source)
	}
	if info.Rank < 0 || info.Rank >= info.Size {
		return fmt.Errorf("comm: rank %d is outside a world of size %d (from %s)", info.Rank, info.Size, info.Source)
	}
	if info.LocalRank < 0 {
		return fmt.Errorf("comm: %s=%d: a local rank is at least 0 (from %s)", s.local, info.LocalRank, info.Source)
	}
	if s.localSize == "" || info.LocalSize == 0 {
		return nil // the launcher does not say
	}
	if info.LocalSize > info.Size {
		return fmt.Errorf("comm: %s=%d is more than %s=%d: a host cannot run more ranks than the job has (from %s)",
			s.localSize, info.LocalSize, s.size, info.Size, info.Source)
	}
	if info.LocalRank >= info.LocalSize {
		return fmt.Errorf("comm: %s=%d is outside %s=%d: local ranks on a host are 0 to %d (from %s)",
			s.local, info.LocalRank, s.localSize, info.LocalSize, info.LocalSize-1, info.Source)
	}
	return nil
}

// readMaster sets the rendezvous address: MASTER_ADDR when set; under Slurm
// the first host of SLURM_STEP_NODELIST, which is where rank 0 runs.
func readMaster(env map[string]string, info *EnvInfo) error {
	if v := strings.TrimSpace(env["MASTER_ADDR"]); v != "" {
		info.MasterAddr, info.MasterVar = v, "MASTER_ADDR"
		return nil
	}
	if info.Source != "slurm" {
		return nil
	}
	list, ok := env["SLURM_STEP_NODELIST"]
	if !ok {
		return nil
	}
	host, err := firstHost(list)
	if err != nil {
		return fmt.Errorf("comm: SLURM_STEP_NODELIST=%q: %v; set MASTER_ADDR to rank 0's host", list, err)
	}
	info.MasterAddr, info.MasterVar = host, "SLURM_STEP_NODELIST"
	return nil
}

// firstHost is the first host of a Slurm host list such as
// "node[07-09,12],gpu3": "node07". Ranges keep their zero padding.
func firstHost(list string) (string, error) {
	list = strings.TrimSpace(list)
	end := strings.IndexAny(list, ",[")
	if end < 0 {
		if list == "" {
			return "", fmt.Errorf("empty host list")
		}
		return list, nil
	}
	if list[end] == ',' {
		if end == 0 {
			return "", fmt.Errorf("empty first host")
		}
		return list[:end], nil
	}
	prefix := list[:end]
	close := strings.IndexByte(list[end:], ']')
	if close < 0 {
		return "", fmt.Errorf("unclosed '['")
	}
	first, _, _ := strings.Cut(list[end+1:end+close], ",")
	first, _, _ = strings.Cut(first, "-")
	if first == "" || strings.Trim(first, "0123456789") != "" {
		return "", fmt.Errorf("range %q does not start with a number", list[end:end+close+1])
	}
	return prefix + first, nil
}

// spanCheck refuses a tcp job whose ranks span hosts but that has no
// rendezvous address: the default, loopback, cannot be reached from the
// other hosts.
func spanCheck(info EnvInfo) error {
	if info.Hosts < 2 || info.MasterVar != "" {
		return nil
	}
	var what string
	switch info.Source {
	case "openmpi":
		what = fmt.Sprintf("OMPI_COMM_WORLD_LOCAL_SIZE=%d of OMPI_COMM_WORLD_SIZE=%d", info.LocalSize, info.Size)
	case "pmi":
		what = fmt.Sprintf("MPI_LOCALNRANKS=%d of PMI_SIZE=%d", info.LocalSize, info.Size)
	case "slurm":
		what = fmt.Sprintf("SLURM_STEP_NUM_NODES=%d without SLURM_STEP_NODELIST", info.Hosts)
	default:
		what = fmt.Sprintf("LOCAL_WORLD_SIZE=%d of WORLD_SIZE=%d", info.LocalSize, info.Size)
	}
	return fmt.Errorf("comm: the ranks span several hosts (%s) but MASTER_ADDR is not set; set MASTER_ADDR to rank 0's host for the tcp backend (mpirun -x MASTER_ADDR=... passes it on), or use comm.backend=mpi", what)
}
