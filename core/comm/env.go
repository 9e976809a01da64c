package comm

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// EnvInfo is what a rank learns about the job from its environment.
type EnvInfo struct {
	Rank       int
	Size       int
	LocalRank  int
	LocalSize  int // 0 when the launcher does not say
	MasterAddr string
	MasterPort int
	Token      string // TINYACC_JOB_TOKEN, the per-job secret every connection presents
	HostID     string // TINYACC_HOST_ID, overrides the host identity (hostid.go)
	MasterVar  string // the variable MasterAddr came from; "" for the default
	Hosts      int    // hosts the launcher says the ranks span; 0 when it does not say
	Source     string // "torchrun", "openmpi", "pmi", "slurm" or "single"
	Debug      bool   // TINYACC_DEBUG=detail
}

const (
	defaultMasterAddr = "127.0.0.1"
	defaultMasterPort = 29500
)

// ReadEnv parses environ (os.Environ() form). Rank variables are taken from
// the innermost launcher that set them (launchenv.go): torchrun-style
// RANK/WORLD_SIZE (what tinyacc launch sets), then Open MPI, then PMI
// (MPICH, Intel MPI), then Slurm; with none, the process is a world of one.
func ReadEnv(environ []string) (EnvInfo, error) {
	env := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	info := EnvInfo{MasterAddr: defaultMasterAddr, MasterPort: defaultMasterPort, Size: 1, Source: "single"}
	num := func(key string, dst *int) error {
		v, ok := env[key]
		if !ok {
			return nil
		}
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("comm: %s=%q is not an integer", key, v)
		}
		*dst = n
		return nil
	}
	if err := readLauncher(env, &info, num); err != nil {
		return info, err
	}
	if err := checkRanks(info); err != nil {
		return info, err
	}
	if err := readMaster(env, &info); err != nil {
		return info, err
	}
	if err := num("MASTER_PORT", &info.MasterPort); err != nil {
		return info, err
	}
	if info.MasterPort < 1 || info.MasterPort > 65535 {
		return info, fmt.Errorf("comm: MASTER_PORT=%d is not a valid port (1-65535)", info.MasterPort)
	}
	info.Token = jobToken(env, info.Source)
	switch s := env["TINYACC_SHM"]; s {
	case "", "0", "1", "true", "false":
	default:
		return info, fmt.Errorf("comm: TINYACC_SHM=%q: use 0 or false to keep transfers on TCP, 1 or true (the default) for shared memory", s)
	}
	info.HostID = strings.TrimSpace(env[HostIDVar])
	switch d := env["TINYACC_DEBUG"]; d {
	case "", "off", "0":
	case "detail":
		info.Debug = true
	default:
		return info, fmt.Errorf("comm: TINYACC_DEBUG=%q: use \"detail\" or leave it unset", d)
	}
	return info, nil
}

// InitFromEnv creates this process's world group from its environment with
// the backend opts.Backend (tcp by default). A world of one needs no network.
func InitFromEnv(opts Options) (Group, error) {
	info, err := ReadEnv(os.Environ())
	if err != nil {
		return nil, err
	}
	// The deadline comes from opts alone (comm.timeout, through the
	// config's layers): a second source here would disagree with it.
	opts.Debug = opts.Debug || info.Debug
	name := opts.Backend
	if name == "" {
		name = "tcp"
	}
	if info.Size == 1 {
		groups, err := NewLocal(1, opts)
		if err != nil {
			return nil, err
		}
		return groups[0], nil
	}
	backendsMu.Lock()
	f := backends[name]
	backendsMu.Unlock()
	if f == nil {
		return nil, fmt.Errorf("comm: unknown backend %q for a world of %d processes (available: %s; \"local\" runs ranks as goroutines through RunLocal)",
			name, info.Size, strings.Join(backendNames(), ", "))
	}
	return f(info, opts)
}

// tokenVar names the per-job secret every connection of a job presents.
const tokenVar = "TINYACC_JOB_TOKEN"

// openMPIJobKey is a random key mpirun draws for each job and gives every
// one of its processes, on every host, and nothing else: a secret the
// ranks already share.
const openMPIJobKey = "OMPI_MCA_orte_precondition_transports"

// jobToken is TINYACC_JOB_TOKEN; without it, under mpirun, a token derived
// from mpirun's own per-job key, so that `mpirun tinyacc train` is as
// closed to strangers as `tinyacc launch` without anyone exporting one. The
// key is hashed, never sent: the token travels in every hello.
func jobToken(env map[string]string, source string) string {
	if t := env[tokenVar]; t != "" {
		return t
	}
	if key := env[openMPIJobKey]; key != "" && source == "openmpi" {
		sum := sha256.Sum256([]byte("tinyacc job token\x00" + key))
		return "openmpi-" + hex.EncodeToString(sum[:])
	}
	return ""
}

// warnNoToken says, once per job (rank 0 says it), that the job runs
// without a token, and how to give it one.
func warnNoToken(log io.Writer, env EnvInfo) {
	fmt.Fprintf(log, "comm: warning: %s is not set, so any process that reaches %s:%d can join this job as a rank; "+
		"tinyacc launch and train --nproc give their ranks one, and ranks under Open MPI's mpirun derive one from it; otherwise export the same secret to every rank, e.g. %s=$(openssl rand -hex 32)\n",
		tokenVar, env.MasterAddr, env.MasterPort, tokenVar)
}
