//go:build linux

package comm

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/tensor"
	"github.com/tinyacc/tinyacc/internal/netnstest"
)

// spreadScenario runs every collective at a size of many segment rounds on
// inputs that add exactly, and reports a digest of every result this rank
// got and the hosts its world group found.
func spreadScenario(g Group) {
	const cnt = 300_007
	me := g.Rank()
	h := sha256.New()
	add := func(x *tensor.Tensor) { h.Write(bytesOf(x)) }
	run := func() error {
		ar := filled(tensor.Float32, me, cnt, 0)
		if err := g.AllReduce(ar, Avg); err != nil {
			return err
		}
		add(ar)
		out := tensor.Default.New(tensor.Comm, tensor.Float32, cnt)
		if err := g.ReduceScatter(filled(tensor.Float32, me, 4*cnt, 1), out, Sum); err != nil {
			return err
		}
		add(out)
		ag := tensor.Default.New(tensor.Comm, tensor.Float32, 4*cnt)
		if err := g.AllGather(filled(tensor.Float32, me, cnt, 2), ag); err != nil {
			return err
		}
		add(ag)
		b := filled(tensor.Float32, me, cnt, 3)
		if err := g.Broadcast(b, 1); err != nil {
			return err
		}
		add(b)
		rd := filled(tensor.Float32, me, cnt, 4)
		if err := g.Reduce(rd, 2, Min); err != nil {
			return err
		}
		add(rd)
		return nil
	}
	if err := run(); err != nil {
		fmt.Println("RESULT", err)
	} else {
		hosts, members := spreadOf(g)
		fmt.Printf("RESULT %s hosts %v segment %d\n", hex.EncodeToString(h.Sum(nil)), hosts, members)
	}
	_ = g.Close()
}

func init() { scenarios["spread"] = spreadScenario }

// Two "hosts" that are two network namespaces joined by a veth pair (only
// the pair's private addresses, which exist inside these namespaces alone,
// are used), two rank processes in each, TINYACC_HOST_ID telling the hosts
// apart: every collective's results equal, bit for bit, those of the four
// ranks on one host, and the world group found the two hosts.
func TestSpreadAcrossNetnsHostsMatchesOneHost(t *testing.T) {
	p := netnstest.New(t)

	// run starts the 4 ranks, inside the namespaces when spread.
	run := func(spread bool) []string {
		addr, port := "127.0.0.1", 0
		if spread {
			addr, port = netnstest.AddrA, 29500
		} else {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			port = ln.Addr().(*net.TCPAddr).Port
			ln.Close()
		}
		outs := make([]string, 4)
		var wg sync.WaitGroup
		for r := range 4 {
			argv := []string{os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1"}
			env := []string{"TINYACC_SHM=1", "TINYACC_TEST_SCENARIO=spread",
				"RANK=" + strconv.Itoa(r), "WORLD_SIZE=4", "LOCAL_RANK=" + strconv.Itoa(r), "LOCAL_WORLD_SIZE=4",
				"MASTER_ADDR=" + addr, "MASTER_PORT=" + strconv.Itoa(port), "TINYACC_JOB_TOKEN=process-test-token"}
			if spread {
				ns, host := p.A, "hostA"
				if r >= 2 {
					ns, host = p.B, "hostB"
				}
				argv = netnstest.Exec(ns, argv...)
				env = append(env, "TINYACC_HOST_ID="+host, "LOCAL_RANK="+strconv.Itoa(r%2), "LOCAL_WORLD_SIZE=2")
			}
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.Env = append(os.Environ(), env...)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			require.NoError(t, cmd.Start())
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = cmd.Wait()
				outs[r] = out.String()
			}()
		}
		wg.Wait()
		return outs
	}
	one, two := run(false), run(true)
	for r := range 4 {
		digest, layout, _ := strings.Cut(result(one[r]), " hosts ")
		assert.Equal(t, "[] segment 0", layout, "rank %d on one host:\n%s", r, one[r])
		assert.Equal(t, fmt.Sprintf("%s hosts [[0 1] [2 3]] segment 2", digest), result(two[r]), "rank %d on two hosts:\n%s", r, two[r])
	}
}
