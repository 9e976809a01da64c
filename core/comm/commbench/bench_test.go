package commbench

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
)

func TestParseSizes(t *testing.T) {
	got, err := ParseSizes("4K,64K,1M,16M,64M,2G,100")
	require.NoError(t, err)
	assert.Equal(t, []int64{4096, 65536, 1 << 20, 16 << 20, 64 << 20, 2 << 30, 100}, got)
	_, err = ParseSizes("4X")
	assert.EqualError(t, err, `commbench: size "4X" is not a positive number with an optional K, M or G suffix`)
	_, err = ParseSizes(",")
	assert.EqualError(t, err, `commbench: no sizes in ","`)
}

func TestBusFactor(t *testing.T) {
	f, _ := BusFactor("all_reduce", 4)
	assert.Equal(t, 1.5, f)
	f, _ = BusFactor("all_gather", 4)
	assert.Equal(t, 0.75, f)
	f, _ = BusFactor("broadcast", 4)
	assert.Equal(t, 1.0, f)
	f, _ = BusFactor("all_to_all", 4)
	assert.Equal(t, 0.75, f)
	_, err := BusFactor("gossip", 4)
	assert.EqualError(t, err, `commbench: unknown op "gossip" (use one of all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, memcpy)`)
}

func TestRunJSON(t *testing.T) {
	for _, op := range Ops {
		var mu sync.Mutex
		var out bytes.Buffer
		err := comm.RunLocal(3, comm.Options{}, func(g comm.Group) error {
			var buf bytes.Buffer
			if err := Run(g, op, []int64{12 << 10, 96 << 10}, 3, 1, &buf, true); err != nil {
				return err
			}
			mu.Lock()
			out.Write(buf.Bytes())
			mu.Unlock()
			return nil
		})
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		require.Len(t, lines, 2, "only rank 0 prints")
		for i, want := range []int64{12 << 10, 96 << 10} {
			var m map[string]any
			require.NoError(t, json.Unmarshal([]byte(lines[i]), &m))
			assert.ElementsMatch(t, []string{"op", "nranks", "bytes", "time_ms", "algbw_gbps", "busbw_gbps"}, keys(m))
			assert.Equal(t, op, m["op"])
			assert.Equal(t, 3.0, m["nranks"])
			assert.Equal(t, float64(want), m["bytes"])
			f, _ := BusFactor(op, 3)
			algbw := float64(want) / (m["time_ms"].(float64) / 1e3) / 1e9
			assert.InDelta(t, algbw, m["algbw_gbps"], algbw*1e-9)
			assert.InDelta(t, algbw*f, m["busbw_gbps"], algbw*1e-9)
		}
	}
}

func keys(m map[string]any) []string {
	var k []string
	for s := range m {
		k = append(k, s)
	}
	return k
}

func TestRunTable(t *testing.T) {
	var out bytes.Buffer
	var mu sync.Mutex
	require.NoError(t, comm.RunLocal(2, comm.Options{}, func(g comm.Group) error {
		var buf bytes.Buffer
		err := Run(g, "all_reduce", []int64{4 << 10}, 2, 0, &buf, false)
		mu.Lock()
		out.Write(buf.Bytes())
		mu.Unlock()
		return err
	}))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 3)
	assert.Equal(t, "# all_reduce on 2 ranks", lines[0])
	assert.Equal(t, []string{"size", "time_ms", "algbw", "GB/s", "busbw", "GB/s"}, strings.Fields(lines[1]))
	assert.Equal(t, "4K", strings.Fields(lines[2])[0])
}
