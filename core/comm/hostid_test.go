//go:build linux

package comm

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/tensor"
)

func TestSameHostPeers(t *testing.T) {
	ids := []string{"id:a", "id:a", "id:b", "", ""}
	assert.Equal(t, []bool{false, true, false, false, false}, sameHostPeers(ids, 0))
	assert.Equal(t, []bool{false, false, false, false, false}, sameHostPeers(ids, 2))
	// No identity shares memory with no one, not even another without one.
	assert.Equal(t, []bool{false, false, false, false, false}, sameHostPeers(ids, 3))
}

func TestHostIdentityOverride(t *testing.T) {
	id, err := hostIdentity("rack7-node3")
	require.NoError(t, err)
	assert.Equal(t, "id:rack7-node3", id)
	own, err := hostIdentity("")
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(own, "host:"), own)
	info, err := ReadEnv([]string{"TINYACC_HOST_ID= nodeB "})
	require.NoError(t, err)
	assert.Equal(t, "nodeB", info.HostID)
}

// Two "hosts" of two ranks each, told apart only by their host identity:
// same-host pairs get rings both ways, cross-host pairs none (their data
// goes over TCP), each rank says so in one line, and the collectives still
// match the serial reference across the host boundary.
func TestHostIdentityDecidesSharedMemory(t *testing.T) {
	log := &syncBuffer{}
	hosts := []string{"hostA", "hostA", "hostB", "hostB"}
	err := runTCPLocalHosts(4, hosts, Options{Log: log, ChunkBytes: 8 << 10}, func(g Group) error {
		out, in := ringsWith(g)
		mate := g.Rank() ^ 1
		if fmt.Sprint(out) != fmt.Sprint([]int{mate}) || fmt.Sprint(in) != fmt.Sprint([]int{mate}) {
			return fmt.Errorf("rank %d: rings out %v in %v, want only rank %d", g.Rank(), out, in, mate)
		}
		return checkAllOps(g, []tensor.DType{tensor.Float32})
	})
	require.NoError(t, err)
	for r, want := range []string{"[1], tcp with ranks [2 3]", "[0], tcp with ranks [2 3]", "[3], tcp with ranks [0 1]", "[2], tcp with ranks [0 1]"} {
		assert.Contains(t, log.String(), fmt.Sprintf("comm: rank %d on 2 hosts: shared memory with ranks %s\n", r, want))
	}
}

// Ranks on one host print no link line.
func TestOneHostLogsNoLinks(t *testing.T) {
	log := &syncBuffer{}
	require.NoError(t, runTCPLocalHosts(2, nil, Options{Log: log}, func(g Group) error { return g.Barrier() }))
	assert.NotContains(t, log.String(), "hosts: shared memory")
}

func TestStoreBindHost(t *testing.T) {
	assert.Equal(t, "127.0.0.1", storeBindHost("localhost"))
	assert.Equal(t, "10.200.0.1", storeBindHost("10.200.0.1"))
	assert.Equal(t, "::1", storeBindHost("::1"))
	assert.Equal(t, "", storeBindHost("node01"))
}
