package plan

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/config"
	"github.com/tinyacc/tinyacc/core/trainer"
	"github.com/tinyacc/tinyacc/plugins"
)

// golden is the fixed profile of testdata: every product at 1 GFLOP/s per
// thread (4 on all 4 cores), kernels at 1 GB/s per thread, collectives
// of 100 µs (2 ranks) or 200 µs (4 ranks) and 1 GB/s, all-to-all of 300
// µs (2 ranks) or 400 µs (4 ranks) and 0.5 GB/s, overlap 0.5.
func golden(t *testing.T) *Profile {
	t.Helper()
	p, err := Load("testdata/profile.json")
	require.NoError(t, err)
	return p
}

func tinyConfig() config.Config {
	cfg := config.Defaults()
	cfg.Model.NLayer, cfg.Model.NHead, cfg.Model.NEmbd, cfg.Model.BlockSize, cfg.Model.VocabSize = 4, 4, 64, 32, 4096
	cfg.Train.BatchSize, cfg.Train.GradAccum = 8, 1
	cfg.Memory.Limit = "0"
	return cfg
}

// find is the candidate of res named name.
func find(t *testing.T, res Result, name string) Candidate {
	t.Helper()
	for _, c := range res.Fits {
		if c.Name() == name {
			return c
		}
	}
	t.Fatalf("no layout %q among the %d that fit", name, len(res.Fits))
	return Candidate{}
}

// One process on all 4 cores of the golden machine (4 GFLOP/s, 4 GB/s),
// worked out by hand from the model's doc: per token, a GPT-2 block's
// forward is 24C² + 4TC FLOPs and the head's 2VC; a block moves 4·(6C +
// 12C) bytes of activations and the logits 4·3V; backward is twice the
// forward; the optimizer moves 32 bytes per parameter; one rank has no
// collective.
func TestPredictOneProcessByHand(t *testing.T) {
	cfg := tinyConfig()
	pred, err := Predict(cfg, 1, golden(t))
	require.NoError(t, err)
	C, T, V, L, rows := 64.0, 32.0, 4096.0, 4.0, 8.0*32
	flops := rows * (L*(24*C*C+4*T*C) + 2*V*C)
	bytes := rows * (L*4*(6*C+12*C) + 4*3*V)
	fwd := flops/4e9 + bytes/4e9
	psi := V*C + T*C + L*(12*C*C+13*C) + 2*C
	want := 3*fwd + 32*psi/4e9
	require.InDelta(t, want, pred.Step, 1e-12*want)
	require.InDelta(t, pred.Step, pred.Compute, 1e-12*want)
	require.Zero(t, pred.Comm)
	require.Zero(t, pred.Bubble)
}

// Under a limit that data parallel over 4 ranks without ZeRO exceeds and
// ZeRO-3 meets, the search keeps dp4 z3 and excludes dp4 (same
// micro-batches) by the memory rule; every enumerated layout is either
// kept or counted by one rule.
func TestSearchExcludesByMemory(t *testing.T) {
	cfg := tinyConfig()
	base := cfg
	base.Parallel.DP, base.Train.BatchSize = 4, 2
	plain, err := plugins.Need(base, 4, 4)
	require.NoError(t, err)
	base.Zero.Stage = 3
	z3, err := plugins.Need(base, 4, 4)
	require.NoError(t, err)
	require.Less(t, z3, plain)

	res := Search(cfg, 4, z3, golden(t))
	find(t, res, "dp4 z3 m1×b2")
	for _, c := range res.Fits {
		require.NotEqual(t, "dp4 m1×b2", c.Name())
		require.LessOrEqual(t, c.PerRank, z3)
	}
	n := len(res.Fits)
	mem := 0
	for _, e := range res.Excluded {
		n += e.Count
		if e.Rule == "need > "+trainer.FormatBytes(z3)+" per rank (memory.limit over 4 ranks)" {
			mem = e.Count
		}
	}
	require.Equal(t, len(plugins.Layouts(cfg, 4, plugins.PlanDims(8))), res.Enumerated)
	require.Equal(t, res.Enumerated, n)
	require.Positive(t, mem, "%v", res.Excluded)
}

// The naive sum (compute plus the bubble formula's (p-1)/(v·m) share)
// puts interleaved pp2 × cp2 over 8 micro-batches ahead of 1F1B pp2 × dp2
// over 4; played by the pipeline simulator the order reverses: with 4
// blocks in 4 chunks, the last chunk carries one block and the head of a
// 4096-token vocabulary, several times a block's work, and the formula
// assumes equal chunks.
func TestSimulatorOrdersUnlikeNaiveSum(t *testing.T) {
	res := Search(tinyConfig(), 4, 0, golden(t))
	il := find(t, res, "dp1 pp2 cp2 interleaved/v2 m8×b1")
	ofob := find(t, res, "dp2 pp2 1f1b m4×b1")
	require.Less(t, il.Pred.Naive, ofob.Pred.Naive)
	require.Less(t, ofob.Pred.Step, il.Pred.Step)
	for _, c := range []Candidate{il, ofob} {
		p := c.Pred
		require.InDelta(t, p.Step, p.Compute+p.Comm+p.Bubble, 1e-12)
		require.Positive(t, p.Bubble)
	}
}

// A pipeline of one micro-batch on the golden machine: one stage computes
// at a time, and the three that wait leave it all 4 cores (pp.SimulateShared),
// so the four chunks run at 4 GFLOP/s and 4 GB/s, one after the other,
// as one process does; the step is one process's forward and backward,
// the six messages along the way (3 activations, 3 gradients), each stage's
// optimizer on its quarter of the parameters at the rate a rank has when
// all four compute (1 GB/s), the loss's and gradient norm's all-reduces
// over 4 ranks and the tied embedding's over the first and last stage.
// Worked out by hand from the model's doc.
func TestPredictPipelineWaitingStagesLendCores(t *testing.T) {
	cfg := tinyConfig()
	cfg.Parallel.PP, cfg.PP.Schedule = 4, "afab"
	pred, err := Predict(cfg, 4, golden(t))
	require.NoError(t, err)
	C, T, V, L, rows := 64.0, 32.0, 4096.0, 4.0, 8.0*32
	flops := rows * (L*(24*C*C+4*T*C) + 2*V*C)
	bytes := rows * (L*4*(6*C+12*C) + 4*3*V)
	fwd := flops/4e9 + bytes/4e9
	msg := 1e-4 + 4*rows*C/1e9 // broadcast on 2 ranks: one activation
	psi := V*C + T*C + L*(12*C*C+13*C) + 2*C
	optim := 32 * psi / 4 / 1e9
	small := 2*(2e-4+16*1.5/1e9) + (1e-4 + 4*V*C/1e9)
	want := 3*fwd + 6*msg + optim + small
	require.InDelta(t, want, pred.Step, 1e-9*want)
	require.InDelta(t, pred.Step, pred.Compute+pred.Comm+pred.Bubble, 1e-12)
}

// Expert parallel on the golden machine, worked out by hand: dp 4 with 2
// sequences a rank, 4 mixture-of-experts blocks of 4 experts (each an MLP
// of 8C²+5C parameters, X in all), top 2, DDP's naive all-reduce (no
// overlap). Under ep 2 each block's forward sends the expert counts (4
// float64) and twice the rank's routed rows (64 tokens × 2 × 64 floats),
// its backward the rows twice more, each an all-to-all on 2 ranks (300
// µs + (1/2)·bytes at 0.5 GB/s). The rank holds half the experts: DDP
// all-reduces the Ψ-X others over the 4 ranks (200 µs + 1.5·4 bytes at 1
// GB/s) and the experts' X/2 go over the 2 ranks holding the same ones
// (100 µs + 4 bytes at 1 GB/s), where ep 1 all-reduces all Ψ over 4; the
// optimizer (32 bytes per parameter at 1 GB/s) updates X/2 fewer.
func TestPredictExpertParallelAllToAll(t *testing.T) {
	cfg := tinyConfig()
	cfg.Model.MoE.Experts, cfg.Model.MoE.TopK, cfg.Model.MoE.Every = 4, 2, 1
	cfg.Train.BatchSize, cfg.DDP.Mode = 2, "naive"
	one, err := Predict(cfg, 4, golden(t))
	require.NoError(t, err)
	cfg.Parallel.EP = 2
	two, err := Predict(cfg, 4, golden(t))
	require.NoError(t, err)
	a2a := func(bytes float64) float64 { return 3e-4 + bytes/2/0.5e9 }
	rows := 4.0 * 64 * 2 * 64
	exchange := 4 * (a2a(8*4) + 4*a2a(rows))
	C := 64.0
	X := 4 * 4 * (8*C*C + 5*C)
	psi := float64(trainer.GPTConfig(cfg).NumParams())
	grads := (2e-4 + 1.5*4*(psi-X)/1e9) + (1e-4 + 4*X/2/1e9) - (2e-4 + 1.5*4*psi/1e9)
	require.InDelta(t, exchange+grads, two.Comm-one.Comm, 1e-9*exchange)
	optim := -32 * X / 2 / 1e9
	require.InDelta(t, exchange+grads+optim, two.Step-one.Step, 1e-9*exchange)

	// The naive form (ep.dispatch allgather): forward all-gathers both
	// ranks' rows (2 × 64 tokens × 64 floats), routing weights (× 2
	// float32) and choices (× 2 float64) and reduce-scatters the outputs;
	// backward reduce-scatters the rows' and weights' gradients and
	// all-gathers the outputs': 7 collectives on 2 ranks of 100 µs +
	// (1/2)·bytes at 1 GB/s.
	cfg.EP.Dispatch = "allgather"
	gather, err := Predict(cfg, 4, golden(t))
	require.NoError(t, err)
	h, w, ch := 4*2*64*64.0, 4*2*64*2.0, 8*2*64*2.0
	want := 4 * (7e-4 + (4*h+2*w+ch)/2/1e9)
	require.InDelta(t, want+grads+optim, gather.Step-one.Step, 1e-9*want)
}

// Under tensor parallel each expert is split like the dense MLP, so each
// of a MoE block's experts on the rank all-reduces its rows over the tp
// group, forward (its output) and backward (its input's gradient), in
// place of the dense MLP's one all-reduce per direction. Worked by hand
// on the golden profile (all-reduces of 2 ranks: 100 µs + bytes at 1
// GB/s; all-to-all of 2 ranks: 300 µs + bytes/2 at 0.5 GB/s), 4 MoE
// blocks of 4 experts, top-2, 2 sequences of 32 tokens (64 rows, 64
// wide, 16384 bytes): against the dense model of the same shape, tp 2
// alone (no gradient all-reduce: dp 1) adds per block and direction 4
// all-reduces of 64·2 rows spread over 4 experts (8192 bytes each) less
// the MLP's of 16384 bytes; ep 2 × tp 2 (dp 2) 2 all-reduces of 16384
// bytes less one, beside the all-to-alls and the smaller gradient
// all-reduce (the experts' gradients have one replica each: none).
func TestPredictExpertsUnderTensorParallel(t *testing.T) {
	ar := func(bytes float64) float64 { return 1e-4 + bytes/1e9 }
	a2a := func(bytes float64) float64 { return 3e-4 + bytes/2/0.5e9 }
	dense := tinyConfig()
	dense.Train.BatchSize, dense.DDP.Mode, dense.Parallel.TP = 2, "naive", 2
	moe := dense
	moe.Model.MoE.Experts, moe.Model.MoE.TopK, moe.Model.MoE.Every = 4, 2, 1
	one := 4.0 * 64 * 64 // one all-reduce of the dense MLP: 64 rows × 64 floats

	d, err := Predict(dense, 2, golden(t))
	require.NoError(t, err)
	m, err := Predict(moe, 2, golden(t))
	require.NoError(t, err)
	want := 4 * 2 * (4*ar(2*one/4) - ar(one))
	require.InDelta(t, want, m.Comm-d.Comm, 1e-9*want)

	d, err = Predict(dense, 4, golden(t))
	require.NoError(t, err)
	moe.Parallel.EP = 2
	m, err = Predict(moe, 4, golden(t))
	require.NoError(t, err)
	experts := 4 * 2 * (2*ar(2*one/2) - ar(one))
	exchange := 4 * (a2a(8*4) + 4*a2a(2*one))
	X := float64(trainer.GPTConfig(moe).ExpertParams())
	grads := ar(4*(float64(trainer.GPTConfig(moe).NumParams())-X)/2) - ar(4*float64(trainer.GPTConfig(dense).NumParams())/2)
	want = experts + exchange + grads
	require.InDelta(t, want, m.Comm-d.Comm, 1e-9*want)
}

// A collective of 2 ranks inside a world of 4 waits at least what a small
// one adds between compute with 4 ranks on the machine (their busy
// latency), not the 2 ranks' own: waking a waiting member depends on how
// many ranks compete for the cores. Alone (a world of 2) it keeps the 2
// ranks' figures.
func TestCollectiveWaitsTheWorldsBusyLatency(t *testing.T) {
	p := golden(t)
	for i := range p.Collectives {
		if p.Collectives[i].N == 4 {
			p.Collectives[i].Busy = 1e-3
		}
	}
	bytes := 1e6
	require.InDelta(t, 1e-4+bytes/1e9, p.collectiveIn("tcp", "all_reduce", 2, 2, bytes), 1e-15)
	require.InDelta(t, 1e-3+bytes/1e9, p.collectiveIn("tcp", "all_reduce", 2, 4, bytes), 1e-15)
	require.InDelta(t, 1e-3+bytes*1.5/1e9, p.collectiveIn("tcp", "all_reduce", 4, 4, bytes), 1e-15)
}

// The optimizer's update is priced at the profile's optimizer rate where
// calibrate measured one (its own vectorised loop, not GELU's): on the
// golden machine with AdamW at 4 GB/s a thread (16 on all 4 cores), one
// process's step is the same as without it, less the 32 bytes a
// parameter at 4 GB/s plus at 16.
func TestPredictOptimizerAtItsOwnRate(t *testing.T) {
	cfg := tinyConfig()
	p := golden(t)
	base, err := Predict(cfg, 1, p)
	require.NoError(t, err)
	p.Optimizer = Pair{One: 4e9, All: 16e9}
	pred, err := Predict(cfg, 1, p)
	require.NoError(t, err)
	C, T, V, L := 64.0, 32.0, 4096.0, 4.0
	psi := V*C + T*C + L*(12*C*C+13*C) + 2*C
	want := base.Step - 32*psi/4e9 + 32*psi/16e9
	require.InDelta(t, want, pred.Step, 1e-12*want)
}

// A profile measured on a busy machine says so: the golden one is
// consistent; an efficiency above 1, every thread slower than one on the
// largest products, or a block with no fixed cost is each named.
func TestProfileMeasuredBusy(t *testing.T) {
	p := golden(t)
	p.BlockOverhead = 1e-4
	require.Empty(t, p.Busy())
	p.Efficiency = []Efficiency{{Ranks: 1, Share: 0.8}, {Ranks: 4, Share: 2.39}}
	p.MatMul[len(p.MatMul)-1].FLOPS.All = 0.5e9
	p.BlockOverhead = 0
	require.Equal(t, []string{
		"4 ranks at once ran at 2.39 of the kernel rates (above 1)",
		"1024³ products ran slower on 4 threads than on one (0.5 against 1.0 GFLOP/s)",
		"a block's fixed cost came out 0",
	}, p.Busy())
}

// The split backward of zb1 with one micro-batch on the golden machine
// (whose rates grow with the cores a rank gets, so running two stages at
// once gains nothing over one after the other), worked out by hand: the
// play does the same products as 1F1B, and W reads each product's input
// and output gradient once more: per block 4 bytes × 256 tokens × (4C +
// 12C) widths, and the head's input and logits' gradient, 4 × 256 × (C +
// V), at the 4 GB/s a stage computing alone has (all 4 cores, its peer
// waiting). The one thing W gains is the message of the last stage's
// input gradient: W runs while it travels, where 1F1B's ranks both wait.
// So zb1 is slower than 1F1B by W's bytes less one message.
func TestPredictSplitBackwardOneMicroBatchSlower(t *testing.T) {
	cfg := tinyConfig()
	cfg.Parallel.PP, cfg.PP.Schedule = 2, "1f1b"
	ofob, err := Predict(cfg, 2, golden(t))
	require.NoError(t, err)
	cfg.PP.Schedule = "zb1"
	zb, err := Predict(cfg, 2, golden(t))
	require.NoError(t, err)
	C, V, L, rows := 64.0, 4096.0, 4.0, 8.0*32
	reread := L*4*rows*(4*C+12*C) + 4*rows*(C+V)
	msg := 1e-4 + 4*rows*C/1e9 // broadcast on 2 ranks: one activation gradient
	want := reread/4e9 - msg
	require.Positive(t, want)
	require.InDelta(t, want, zb.Step-ofob.Step, 1e-9*want)
	require.InDelta(t, zb.Step, zb.Compute+zb.Comm+zb.Bubble, 1e-12)
}

// Tensor parallel over 2 ranks, one micro-batch on the golden machine,
// worked out by hand: what the rank waits for is per block two
// all-reduces of one activation (256 tokens × 64 floats) forward and two
// backward, the embedding's sum forward, the head's input gradient
// backward, and the cross-entropy's row maximum (a float a token) and
// sums (two), each an all-reduce on 2 ranks (100 µs + bytes at 1 GB/s),
// and the loss's and gradient norm's all-reduces.
func TestPredictTensorParallelCollectivesByHand(t *testing.T) {
	cfg := tinyConfig()
	cfg.Parallel.TP = 2
	pred, err := Predict(cfg, 2, golden(t))
	require.NoError(t, err)
	ar := func(bytes float64) float64 { return 1e-4 + bytes/1e9 }
	rows, C := 8.0*32, 64.0
	one := ar(4 * rows * C)
	want := 4*4*one + one + one + ar(4*rows) + ar(8*rows) + 2*ar(16)
	require.InDelta(t, want, pred.Comm, 1e-12)
}

// Tensor parallel inside a pipeline: while the other stage computes, a
// member of a tensor-parallel pair that waits for its peer gets a core
// back only when one of that stage's ranks gives its own up, which the
// profile's contended latency bounds. With one micro-batch the stages
// never compute at once, and data-parallel peers wait in step, so only
// the pipeline of several micro-batches pays for it; a collective costs
// the contended latency where the other ranks compute long enough
// between their own waits, and the profile's busy latency where not.
func TestPredictTensorParallelInsidePipelineContended(t *testing.T) {
	calm := golden(t)
	busy := golden(t)
	for i := range busy.Collectives {
		if busy.Collectives[i].N == 4 {
			busy.Collectives[i].Contended = 5e-3
		}
	}
	predict := func(p *Profile, tp, pp, m int, sched string) Prediction {
		cfg := tinyConfig()
		cfg.Parallel.TP, cfg.Parallel.PP, cfg.PP.Schedule = tp, pp, sched
		cfg.Train.BatchSize, cfg.Train.GradAccum = 8/m, m
		pred, err := Predict(cfg, 4, p)
		require.NoError(t, err)
		return pred
	}
	alone := func(p Prediction) Prediction { p.Naive = 0; return p } // the naive sum has every stage computing
	require.Equal(t, alone(predict(calm, 2, 2, 1, "1f1b")), alone(predict(busy, 2, 2, 1, "1f1b")))
	require.Equal(t, predict(calm, 2, 1, 4, "1f1b"), predict(busy, 2, 1, 4, "1f1b"))
	for _, sched := range []string{"afab", "1f1b"} {
		c, b := predict(calm, 2, 2, 4, sched), predict(busy, 2, 2, 4, sched)
		require.Greater(t, b.Step, c.Step, sched)
		require.Greater(t, b.Comm, c.Comm, sched)
	}

	// The price of one collective on 2 of the 4 ranks: its own latency
	// (100 µs; the golden profile has no busy latency), raised to the
	// contended one, or to the wake-up the other ranks' own waits give
	// when that comes sooner; a profile without a contended latency
	// keeps the first.
	bytes := 1e6
	require.InDelta(t, 1e-4+bytes/1e9, busy.collectiveIn("tcp", "all_reduce", 2, 4, bytes), 1e-15)
	require.InDelta(t, 5e-3+bytes/1e9, busy.contendedIn("tcp", "all_reduce", 2, 4, bytes, 1), 1e-15)
	require.InDelta(t, 1e-3+bytes/1e9, busy.contendedIn("tcp", "all_reduce", 2, 4, bytes, 1e-3), 1e-15)
	require.InDelta(t, 1e-4+bytes/1e9, busy.contendedIn("tcp", "all_reduce", 2, 4, bytes, 1e-5), 1e-15)
	require.InDelta(t, 1e-4+bytes/1e9, calm.contendedIn("tcp", "all_reduce", 2, 4, bytes, 1), 1e-15)
}
