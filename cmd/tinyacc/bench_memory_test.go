package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// `tinyacc bench memory` on a tiny shape: one row per rank of every
// layout, the formula column the Playbook's bytes computed here from the
// shapes, the estimate column what `tinyacc estimate` says for the same
// run, the peer the resident peak of one process on the same global
// batch, and every ratio the quotient of the printed columns.
func TestBenchMemory(t *testing.T) {
	rows := benchMemoryRows(t)
	// Ψ of the 2-layer, 32-wide model: wte 256·32, wpe 16·32, per block
	// 12·32² + 13·32, ln_f 2·32; the LayerNorms are 4·32 per block + 2·32.
	psi := 256*32 + 16*32 + 2*(12*32*32+13*32) + 2*32
	ln := 2*4*32 + 2*32
	want := []struct {
		layout  string
		ranks   int
		formula int64
		flags   []string
	}{
		{"1 process", 1, int64(16 * psi), nil},
		{"zero-3 dp 2", 2, int64(16 * psi / 2), []string{"--nproc", "2", "--parallel.dp=2", "--zero.stage=3"}},
		{"tp 2", 2, int64(16 * ((psi-ln)/2 + ln)), []string{"--nproc", "2", "--parallel.tp=2"}},
		{"pp 2 1f1b", 2, int64(16 * psi / 2), []string{"--nproc", "2", "--parallel.pp=2", "--pp.schedule=1f1b", "--train.grad_accum=2"}},
		{"zero-1 dp 2", 2, int64((4 + 4 + 8/2) * psi), []string{"--nproc", "2", "--parallel.dp=2", "--zero.stage=1"}},
	}
	i := 0
	for _, w := range want {
		est := estimateProcessBytes(t, tinyaccBinary(t), w.flags)
		require.Len(t, est, w.ranks, w.layout)
		for r := 0; r < w.ranks; r++ {
			require.Less(t, i, len(rows), "rows end before %s rank %d", w.layout, r)
			x := rows[i]
			i++
			require.Equal(t, w.layout, x.Layout)
			require.Equal(t, r, x.Rank, w.layout)
			require.Equal(t, w.formula, x.Formula, "%s rank %d formula", w.layout, r)
			require.Equal(t, est[r], x.Est, "%s rank %d estimate against tinyacc estimate", w.layout, r)
			require.Positive(t, x.VmHWM, w.layout)
			require.Positive(t, x.Single, w.layout)
			require.Greater(t, x.Buffers, int64(0), w.layout)
			require.LessOrEqual(t, x.Formula+x.Buffers, x.Est, "%s: formula + buffers are what training needs, within the estimate", w.layout)
			require.InDelta(t, float64(x.VmHWM)/float64(x.Single), x.VsSingle, 1e-9, w.layout)
			require.InDelta(t, float64(x.VmHWM)/float64(x.Formula+x.Buffers), x.VsFormula, 1e-9, w.layout)
			require.InDelta(t, float64(x.VmHWM)/float64(x.Est), x.VsEstimate, 1e-9, w.layout)
			require.LessOrEqual(t, x.AllocPeak, x.VmHWM, "%s: the allocator's peak is resident", w.layout)
		}
	}
	require.Len(t, rows, i)
	// The 1 process row is its own peer; tp trains one process's global
	// batch too (dp 1), so shares that peer; the ranks of a layout share
	// theirs.
	require.Equal(t, rows[0].VmHWM, rows[0].Single)
	require.Equal(t, rows[0].Single, rows[3].Single, "tp 2")
	for _, k := range []int{1, 3, 5} {
		require.Equal(t, rows[k].Single, rows[k+1].Single, rows[k].Layout)
	}
}

// estimateProcessBytes is what `tinyacc estimate --json` says each rank
// of the bench's tiny run needs.
func estimateProcessBytes(t *testing.T, bin string, flags []string) []int64 {
	args := append([]string{"estimate", "--json", "--model.n_layer=2", "--model.n_embd=32", "--model.n_head=2", "--model.block_size=16",
		"--model.vocab_size=256", "--train.batch_size=1", "--data.val_fraction=0"}, flags...)
	out, err := exec.Command(bin, args...).Output()
	require.NoError(t, err, "%v", args)
	var res []int64
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var e struct {
			Peak    int64 `json:"peak_bytes"`
			Setup   int64 `json:"setup_peak_bytes"`
			Data    int64 `json:"data_bytes"`
			Runtime int64 `json:"runtime_bytes"`
			Shared  int64 `json:"shared_bytes"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &e))
		res = append(res, e.Peak+e.Setup+e.Data+e.Runtime+e.Shared)
	}
	return res
}

// `tinyacc bench memory --precision no,bf16` on ZeRO-1 and tp: each
// layout in both precisions side by side, the formula counting 2 + 4
// bytes (copy and master) per parameter in bf16, ZeRO-1 sharding the
// master with the moments, and the allocator's parameters and optimizer
// state equal, to the byte, to the estimate's: in bf16 the parameters are
// the 2-byte copies, fewer than fp32's, and the optimizer state holds the
// masters besides the moments: under ZeRO-1 their shards, (4 + 8)/2 bytes
// per parameter at 2 ranks against fp32's 8/2.
func TestBenchMemoryPrecision(t *testing.T) {
	rows := benchMemoryRows(t, "--layouts", "4,2", "--precision", "no,bf16")
	psi := int64(256*32 + 16*32 + 2*(12*32*32+13*32) + 2*32)
	want := []struct{ layout, mp string }{
		{"zero-1 dp 2", "no"}, {"zero-1 dp 2", "no"}, {"zero-1 dp 2", "bf16"}, {"zero-1 dp 2", "bf16"},
		{"tp 2", "no"}, {"tp 2", "no"}, {"tp 2", "bf16"}, {"tp 2", "bf16"},
	}
	require.Len(t, rows, len(want))
	for i, w := range want {
		x := rows[i]
		require.Equal(t, w.layout, x.Layout)
		require.Equal(t, w.mp, x.Precision)
		require.Equal(t, i%2, x.Rank)
		require.Equal(t, x.EstParamsBytes, x.ParamsBytes, "%s %s rank %d params", w.layout, w.mp, x.Rank)
		require.Equal(t, x.EstOptimBytes, x.OptimBytes, "%s %s rank %d optimizer state", w.layout, w.mp, x.Rank)
		require.Positive(t, x.EstAllocPeak)
		require.InDelta(t, x.ActPeakBytes, x.EstActPeakBytes, 0.1*float64(x.ActPeakBytes), "%s %s rank %d activations", w.layout, w.mp, x.Rank)
	}
	require.Equal(t, (4+4+8/2)*psi, rows[0].Formula)
	require.Equal(t, (2+4+(4+8)/2)*psi, rows[2].Formula)
	for _, x := range rows[2:4] {
		// The masters' padding: at most one element per unit (4 units).
		require.InDelta(t, float64((4+8)/2*psi), float64(x.OptimBytes), 4*4, "zero-1 bf16 rank %d: masters and moments sharded", x.Rank)
	}
	for _, i := range []int{0, 4} {
		require.Less(t, rows[i+2].ParamsBytes, rows[i].ParamsBytes/2+1, "%s: the bf16 copies take at most half fp32's parameters", rows[i].Layout)
		require.Greater(t, rows[i+2].OptimBytes, rows[i].OptimBytes, "%s: the masters join the optimizer state", rows[i].Layout)
		require.Less(t, rows[i+2].ActPeakBytes, rows[i].ActPeakBytes, "%s: the activations kept in 2 bytes", rows[i].Layout)
	}
}

// `tinyacc bench memory --model.arch llama`: the same table for a Llama,
// every run of it a Llama (the estimate column is `tinyacc estimate`'s
// for the Llama, the parameters and optimizer state the estimate's to
// the byte), its formula from the Llama's Ψ with the RMSNorms whole on
// every tensor-parallel rank.
func TestBenchMemoryLlama(t *testing.T) {
	rows := benchMemoryRows(t, "--layouts", "0,2", "--model.arch", "llama", "--n_kv_head", "2")
	// Ψ of the 2-layer, 32-wide Llama (2 heads, SwiGLU 128 wide, untied):
	// embed_tokens and lm_head 256·32 each, model.norm 32, per layer q, k,
	// v, o 32·32 each, gate, up, down 32·128 each and two norms of 32.
	norms := 2*2*32 + 32
	psi := 2*256*32 + 32 + 2*(4*32*32+3*32*128+2*32)
	llama := []string{"--model.arch=llama", "--model.n_kv_head=2"}
	bin := tinyaccBinary(t)
	one, tp := estimateProcessBytes(t, bin, llama), estimateProcessBytes(t, bin, append(llama, "--nproc", "2", "--parallel.tp=2"))
	want := []struct {
		layout  string
		rank    int
		formula int64
		est     int64
	}{
		{"1 process", 0, int64(16 * psi), one[0]},
		{"tp 2", 0, int64(16 * ((psi-norms)/2 + norms)), tp[0]},
		{"tp 2", 1, int64(16 * ((psi-norms)/2 + norms)), tp[1]},
	}
	require.Len(t, rows, len(want))
	for i, w := range want {
		x := rows[i]
		require.Equal(t, w.layout, x.Layout)
		require.Equal(t, w.rank, x.Rank, w.layout)
		require.Equal(t, w.formula, x.Formula, "%s rank %d formula", w.layout, w.rank)
		require.Equal(t, w.est, x.Est, "%s rank %d estimate against tinyacc estimate", w.layout, w.rank)
		require.Equal(t, x.EstParamsBytes, x.ParamsBytes, "%s rank %d params", w.layout, w.rank)
		require.Equal(t, x.EstOptimBytes, x.OptimBytes, "%s rank %d optimizer state", w.layout, w.rank)
	}
	require.Equal(t, int64(4*psi), rows[0].ParamsBytes, "one process holds the Llama's Ψ float32 parameters")
}

// benchMemoryRows runs `tinyacc bench memory --nproc 2 --json` with args on
// a 2-layer, 32-wide model and returns its rows.
func benchMemoryRows(t *testing.T, args ...string) []memoryResult {
	t.Helper()
	shape := []string{"--n_layer", "2", "--n_embd", "32", "--n_head", "2", "--block_size", "16", "--vocab_size", "256"}
	cmd := exec.Command(tinyaccBinary(t), append(append([]string{"bench", "memory", "--nproc", "2", "--json"}, args...), shape...)...)
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "%s", stderr.String())
	var rows []memoryResult
	dec := json.NewDecoder(&stdout)
	for dec.More() {
		var r memoryResult
		require.NoError(t, dec.Decode(&r))
		rows = append(rows, r)
	}
	return rows
}

// A Llama's keys without --model.arch llama, an unknown architecture and
// a layout the Llama does not fit are refused before anything runs.
func TestBenchMemoryRefusesBadModel(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--n_kv_head", "2"}, "bench memory: --n_kv_head and --intermediate_size shape a Llama: add --model.arch llama"},
		{[]string{"--model.arch", "bert"}, `bench memory: --model.arch "bert": want gpt2 or llama`},
		{[]string{"--model.arch", "llama", "--n_kv_head", "1", "--n_head", "2", "--n_embd", "32", "--n_layer", "1", "--vocab_size", "256", "--nproc", "2"},
			`bench memory: row "tp 2": config: model.n_kv_head=1 is not divisible by parallel.tp=2: tensor parallel gives every rank the same number of key/value heads; choose n_kv_head a multiple of tp`},
	} {
		var out, errb bytes.Buffer
		require.EqualError(t, benchMemory(c.args, &out, &errb), c.want, "%v", c.args)
		require.NotContains(t, errb.String(), "process(es)", "%v: nothing ran", c.args)
	}
}
