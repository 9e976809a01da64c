package comm

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// Host identity decides, per pair of ranks, whether they may share memory:
// ranks that publish the same identity at rendezvous use the shared-memory
// rings, all others TCP. The address a rank connects from says nothing about
// this (two hosts can reach each other over loopback-like tunnels, one host
// can have many addresses), so the identity is exchanged explicitly.

// HostIDVar overrides the host identity of a rank. Ranks in separate network
// namespaces of one machine set different values so they count as separate
// hosts; ranks that set the same value must really share /dev/shm.
const HostIDVar = "TINYACC_HOST_ID"

// hostIdentity is the identity this rank publishes: the override when set,
// else the hostname and boot id, so that a reused hostname (containers)
// does not match a host that merely has the same name. Where there is no
// boot id (not Linux), the hostname alone.
func hostIdentity(override string) (string, error) {
	if override != "" {
		return "id:" + override, nil
	}
	name, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("no host name: %w (set %s)", err, HostIDVar)
	}
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "host:" + name, nil
	}
	return "host:" + name + "/" + strings.TrimSpace(string(boot)), nil
}

func hostKey(rank int) string { return "tinyacc/host/" + strconv.Itoa(rank) }

// sameHostPeers marks the ranks whose identity equals ids[me]. An empty
// identity matches nothing: such a rank shares memory with no one.
func sameHostPeers(ids []string, me int) []bool {
	local := make([]bool, len(ids))
	for r, id := range ids {
		local[r] = r != me && id != "" && id == ids[me]
	}
	return local
}

// countHosts is the number of distinct identities in ids.
func countHosts(ids []string) int {
	seen := map[string]bool{}
	for _, id := range ids {
		seen[id] = true
	}
	return len(seen)
}

// logLinks reports, in one line, which peers this rank reaches through
// shared memory and which through TCP. Only jobs that span several hosts
// print it: there it is what an operator checks first.
func logLinks(w io.Writer, rank int, ids []string, shm []bool) {
	if countHosts(ids) < 2 {
		return
	}
	var viaShm, viaTCP []int
	for r := range ids {
		switch {
		case r == rank:
		case shm[r]:
			viaShm = append(viaShm, r)
		default:
			viaTCP = append(viaTCP, r)
		}
	}
	fmt.Fprintf(w, "comm: rank %d on %d hosts: shared memory with ranks %v, tcp with ranks %v\n", rank, countHosts(ids), viaShm, viaTCP)
}

// exchangeHostIDs publishes this rank's identity in the store and reads
// every other rank's. Each rank publishes before it reads, so no rank waits
// on one that waits on it. A rank without an identity publishes "" and
// shares memory with no one.
func (t *tcpTransport) exchangeHostIDs(deadline time.Time) ([]string, error) {
	ids := make([]string, t.size)
	id, err := hostIdentity(t.hostOverride)
	if err != nil {
		fmt.Fprintf(t.opts.Log, "comm: rank %d: %v; its transfers use tcp\n", t.rank, err)
	}
	ids[t.rank] = id
	if err := t.store.set(hostKey(t.rank), []byte(id), deadline); err != nil {
		return nil, err
	}
	for r := range ids {
		if r == t.rank {
			continue
		}
		v, err := t.store.get(hostKey(r), deadline)
		if err != nil {
			return nil, fmt.Errorf("comm: rank %d waiting for the host identity of rank %d: %w", t.rank, r, err)
		}
		ids[r] = string(v)
	}
	return ids, nil
}
