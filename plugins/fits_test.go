package plugins

import (
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins/ptest"
)

// need is the most memory a rank of cfg on world ranks is estimated to
// need.
func need(t *testing.T, cfg config.Config, world int) int64 {
	t.Helper()
	es, err := Estimate(cfg, world)
	require.NoError(t, err)
	var n int64
	for _, e := range es {
		n = max(n, e.ProcessBytes())
	}
	return n
}

// TestMemoryLimitNamesTheLayoutsThatFit: a data-parallel run over 4 ranks
// whose parameters and optimizer state dominate is refused under a limit
// that ZeRO-3 and tensor parallel 4 fit and ZeRO-1 does not. The layouts
// that fit include those two, by their flags and with their own
// estimates, and not ZeRO-1; the refusal's second line names the four
// that need least, least first. Under the limit of its own estimate the
// run is accepted.
func TestMemoryLimitNamesTheLayoutsThatFit(t *testing.T) {
	cfg := ptest.Config()
	cfg.Model.NLayer, cfg.Model.NEmbd, cfg.Model.NHead, cfg.Model.VocabSize = 8, 256, 4, 256
	cfg.Train.BatchSize, cfg.Data.MaxBytes = 1, 1<<16
	with := func(f func(c *config.Config)) config.Config {
		c := cfg
		f(&c)
		return c
	}
	z1 := need(t, with(func(c *config.Config) { c.Zero.Stage = 1 }), 4)
	z3 := need(t, with(func(c *config.Config) { c.Zero.Stage = 3 }), 4)
	tp4 := need(t, with(func(c *config.Config) { c.Parallel.TP = 4 }), 4)
	own := need(t, cfg, 4)
	require.Less(t, z3, z1)
	require.Less(t, tp4, z1)
	perRank := max(z3, tp4)
	require.Less(t, perRank, z1)

	es, err := Estimate(cfg, 4)
	require.NoError(t, err)
	err = CheckMemory(cfg, 4, 0, es, 4*perRank, 4, "test")
	require.Error(t, err)
	lines := strings.Split(err.Error(), "\n")
	require.Len(t, lines, 2, err.Error())
	require.True(t, strings.HasPrefix(lines[0], "memory: rank 0 needs about "+trainer.FormatBytes(own)), lines[0])
	fits := Fits(cfg, 4, 0, perRank)
	var names []string
	for _, f := range fits {
		names = append(names, f.String())
		require.LessOrEqual(t, f.PerRank, perRank, f.Flags)
	}
	require.Contains(t, names, "zero.stage=3 ("+trainer.FormatBytes(z3)+" per rank)")
	require.Contains(t, names, "parallel.tp=4 ("+trainer.FormatBytes(tp4)+" per rank)")
	for _, f := range fits {
		require.NotEqual(t, "zero.stage=1", f.Flags, "ZeRO-1 needs %s per rank", trainer.FormatBytes(z1))
	}
	for i := 1; i < len(fits); i++ {
		require.LessOrEqual(t, fits[i-1].PerRank, fits[i].PerRank, "least memory first")
	}
	require.Greater(t, len(fits), 4)
	require.Equal(t, "fits: "+strings.Join(names[:4], ", ")+" (and "+strconv.Itoa(len(fits)-4)+" more)", lines[1])

	require.NoError(t, CheckMemory(cfg, 4, 0, es, 4*own, 4, "test"), "a run under the limit starts")
}

// TestNeedCountsTheRingsOfTheProcesses: as 4 processes of the tcp
// backend, each rank's process needs beside its own bytes the
// shared-memory rings to the other 3 (one each way per peer, a header
// page and 2 MiB each: 12 MiB and 24 KiB); as goroutine ranks, or on the
// local backend, none. The layouts train's refusal of the processes
// names count the rings: under a limit a layout's ranks meet without
// their rings it is left out; with them it is listed at its need with
// the rings.
func TestNeedCountsTheRingsOfTheProcesses(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the rings are shared memory of Linux")
	}
	const rings = 6 * (4096 + 2<<20)
	cfg := ptest.Config()
	cfg.Model.NLayer, cfg.Model.NEmbd, cfg.Model.NHead, cfg.Model.VocabSize = 8, 256, 4, 256
	cfg.Train.BatchSize, cfg.Data.MaxBytes = 1, 1<<16
	cfg.Comm.Backend = "tcp"
	z3 := cfg
	z3.Zero.Stage = 3
	ranks := need(t, z3, 4)
	for _, n := range []int{0, 1} {
		got, err := Need(z3, 4, n)
		require.NoError(t, err)
		require.Equal(t, ranks, got, "nproc %d: no rings", n)
	}
	got, err := Need(z3, 4, 4)
	require.NoError(t, err)
	require.Equal(t, ranks+rings, got, "4 processes: the rings to 3 peers")
	local := z3
	local.Comm.Backend = "local"
	got, err = Need(local, 4, 4)
	require.NoError(t, err)
	require.Equal(t, ranks, got, "the local backend maps no rings")

	es, err := EstimateProcesses(cfg, 4, 4)
	require.NoError(t, err)
	for _, e := range es {
		require.Equal(t, int64(rings), e.SharedBytes, "rank %d", e.Rank)
	}
	named := func(fits []Fit) []string {
		var names []string
		for _, f := range fits {
			names = append(names, f.String())
		}
		return names
	}
	fits := named(Fits(cfg, 4, 4, ranks+rings))
	require.Contains(t, fits, "zero.stage=3 ("+trainer.FormatBytes(ranks+rings)+" per rank)")
	for _, f := range Fits(cfg, 4, 4, ranks+rings-1) {
		require.NotEqual(t, "zero.stage=3", f.Flags, "its ranks fit, its rings do not")
	}
	err = CheckMemory(cfg, 4, 4, es, 4*(ranks+rings), 4, "test")
	require.Error(t, err)
	require.Greater(t, len(fits), 4)
	require.Equal(t, "fits: "+strings.Join(fits[:4], ", ")+" (and "+strconv.Itoa(len(fits)-4)+" more)", strings.Split(err.Error(), "\n")[1])
}

// TestMeshDimsSplitExpertsWhereThereAreExperts: a mixture of experts on 4
// ranks enumerates parallel.ep over the divisors of dp × cp that divide
// the expert count; a dense model enumerates no ep at all.
func TestMeshDimsSplitExpertsWhereThereAreExperts(t *testing.T) {
	eps := func(cfg config.Config) map[string][]string {
		got := map[string][]string{}
		for _, l := range Layouts(cfg, 4, MeshDims()) {
			mesh := "tp" + strconv.Itoa(l.Config.Parallel.TP) + " pp" + strconv.Itoa(l.Config.Parallel.PP) + " cp" + strconv.Itoa(l.Config.Parallel.CP)
			for _, f := range l.Flags {
				if v, ok := strings.CutPrefix(f, "parallel.ep="); ok && l.Config.Zero.Stage == 0 {
					got[mesh] = append(got[mesh], v)
				}
			}
		}
		return got
	}
	dense := ptest.Config()
	require.Empty(t, eps(dense))
	moe := ptest.Config()
	moe.Model.MoE.Experts = 2
	got := eps(moe)
	require.Equal(t, []string{"1", "2"}, got["tp1 pp1 cp1"], "dp 4: ep 4 does not divide 2 experts")
	require.Equal(t, []string{"1", "2"}, got["tp1 pp1 cp2"], "dp 2 × cp 2")
	require.Equal(t, []string{"1"}, got["tp4 pp1 cp1"], "dp 1")
}
