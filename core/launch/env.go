package launch

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
)

// JobTokenEnv names the per-job secret that ranks present to each other at
// rendezvous, so a stray process (or a previous job on the same port) cannot
// join the group.
const JobTokenEnv = "TINYACC_JOB_TOKEN"

// RestartEnv names the attempt counter: 0 for the first start, k for the k-th
// restart, so a program can resume from its checkpoint instead of starting
// over.
const RestartEnv = "TINYACC_RESTART"

// threadVars are the variables that size thread pools. Left alone, every rank
// would start one thread per core and N ranks would oversubscribe the machine
// N times over.
var threadVars = []string{"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOMAXPROCS"}

// rankSpec is what distinguishes one rank's environment from another's.
type rankSpec struct {
	local      int
	port       int
	token      string
	attempt    int
	threadsPer int
}

// globalRank is RANK for a local rank: nodes own contiguous blocks of ranks,
// which keeps tensor-parallel neighbours (innermost in the mesh) on one host.
func (o Options) globalRank(local int) int { return o.NodeRank*o.NProc + local }

// threadsPerRank shares the cores out evenly, never below one thread.
func threadsPerRank(cpus, nproc int) int {
	if cpus <= 0 {
		cpus = runtime.NumCPU()
	}
	return max(1, cpus/nproc)
}

// rankEnv builds one rank's environment from the launcher's: the rendezvous
// variables always override inherited ones (a stale RANK from an outer job
// would be wrong), while thread counts the user set are kept because the user
// knows the workload better than an even split does.
func rankEnv(base []string, o Options, r rankSpec) []string {
	set := map[string]string{
		"RANK":             strconv.Itoa(o.globalRank(r.local)),
		"LOCAL_RANK":       strconv.Itoa(r.local),
		"WORLD_SIZE":       strconv.Itoa(o.NNodes * o.NProc),
		"LOCAL_WORLD_SIZE": strconv.Itoa(o.NProc),
		"GROUP_RANK":       strconv.Itoa(o.NodeRank),
		"MASTER_ADDR":      o.MasterAddr,
		"MASTER_PORT":      strconv.Itoa(r.port),
		JobTokenEnv:        r.token,
		RestartEnv:         strconv.Itoa(r.attempt),
	}
	for _, k := range threadVars {
		if v, ok := lookupEnv(base, k); !ok || v == "" {
			set[k] = strconv.Itoa(r.threadsPer)
		}
	}
	env := make([]string, 0, len(base)+len(set))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if _, override := set[k]; !override {
			env = append(env, kv)
		}
	}
	// A fixed order keeps the environment reproducible between runs.
	for _, k := range []string{"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
		"MASTER_ADDR", "MASTER_PORT", JobTokenEnv, RestartEnv} {
		env = append(env, k+"="+set[k])
	}
	for _, k := range threadVars {
		if v, ok := set[k]; ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// lookupEnv finds key in a KEY=VALUE list; the last entry wins, as in exec.
func lookupEnv(env []string, key string) (string, bool) {
	val, found := "", false
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			val, found = v, true
		}
	}
	return val, found
}

// jobToken returns the token every rank of the job shares. Nodes of a
// multi-node job cannot agree on a random value on their own, so there the
// user must export one; a single node simply draws it.
func jobToken(env []string, nnodes int) (string, error) {
	if t, ok := lookupEnv(env, JobTokenEnv); ok && t != "" {
		return t, nil
	}
	if nnodes > 1 {
		return "", fmt.Errorf("launch: %s is not set; with --nnodes %d every node needs the same token, e.g. export %s=$(openssl rand -hex 32) on all nodes before launching",
			JobTokenEnv, nnodes, JobTokenEnv)
	}
	return newToken()
}

// newToken draws 32 random bytes, hex encoded: unguessable, and safe to pass
// through environments and command lines.
func newToken() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("launch: generating %s: %w", JobTokenEnv, err)
	}
	return hex.EncodeToString(b[:]), nil
}

// FreePort asks the kernel for a port that is free on addr by listening on
// port 0 and closing at once. Another process could take the port before rank
// 0 binds it, but the window is small and a clash fails loudly at rendezvous.
func FreePort(addr string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		return 0, fmt.Errorf("launch: picking a free port on %s (is --master-addr an address of this host?): %w", addr, err)
	}
	defer ln.Close()
	tcp, ok := ln.Addr().(*net.TCPAddr)
	if !ok || tcp.Port == 0 {
		return 0, errors.New("launch: the kernel returned no port for a listener on port 0")
	}
	return tcp.Port, nil
}
