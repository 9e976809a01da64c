package main

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// rankData is rank r's input: distinct small integers, so float32 sums are
// exact.
func rankData(r, n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32((r*7+i*3)%13 - 6)
	}
	return out
}

func TestCollectivesMatchSerialReduction(t *testing.T) {
	const world, n = 3, 6
	// Serial reference in float64.
	sum, mx, mn := make([]float64, n), make([]float64, n), make([]float64, n)
	for i := 0; i < n; i++ {
		mx[i], mn[i] = -1e9, 1e9
		for r := 0; r < world; r++ {
			v := float64(rankData(r, n)[i])
			sum[i] += v
			mx[i] = max(mx[i], v)
			mn[i] = min(mn[i], v)
		}
	}
	err := comm.RunLocal(world, comm.Options{}, func(g comm.Group) error {
		r := g.Rank()
		check := func(name string, got []float32, want []float64) error {
			for i := range want {
				if d := float64(got[i]) - want[i]; d > 1e-6 || d < -1e-6 {
					return fmt.Errorf("%s[%d] = %v, want %v", name, i, got[i], want[i])
				}
			}
			return nil
		}
		for op, want := range map[int][]float64{0: sum, 2: mx, 3: mn} {
			buf := rankData(r, n)
			if err := allReduce(g, buf, op); err != nil {
				return err
			}
			if err := check(fmt.Sprintf("all_reduce op %d", op), buf, want); err != nil {
				return err
			}
		}
		avg := rankData(r, n)
		if err := allReduce(g, avg, 1); err != nil {
			return err
		}
		want := make([]float64, n)
		for i := range want {
			want[i] = sum[i] / world
		}
		if err := check("all_reduce avg", avg, want); err != nil {
			return err
		}

		gathered := make([]float32, world*n)
		if err := allGather(g, rankData(r, n), gathered); err != nil {
			return err
		}
		for q := 0; q < world; q++ {
			wantQ := make([]float64, n)
			for i, v := range rankData(q, n) {
				wantQ[i] = float64(v)
			}
			if err := check(fmt.Sprintf("all_gather block %d", q), gathered[q*n:(q+1)*n], wantQ); err != nil {
				return err
			}
		}

		// Reduce-scatter of a world*2 buffer: block r of the sum.
		in := rankData(r, world*2)
		out := make([]float32, 2)
		if err := reduceScatter(g, in, out, 0); err != nil {
			return err
		}
		var blk []float64
		for i := r * 2; i < r*2+2; i++ {
			var s float64
			for q := 0; q < world; q++ {
				s += float64(rankData(q, world*2)[i])
			}
			blk = append(blk, s)
		}
		if err := check("reduce_scatter", out, blk); err != nil {
			return err
		}

		b := rankData(r, n)
		if err := broadcast(g, b, 2); err != nil {
			return err
		}
		wantB := make([]float64, n)
		for i, v := range rankData(2, n) {
			wantB[i] = float64(v)
		}
		if err := check("broadcast", b, wantB); err != nil {
			return err
		}
		if err := allGather(g, make([]float32, 2), make([]float32, 5)); err == nil ||
			err.Error() != "all_gather: output holds 5 elements but world size 3 x input 2 = 6" {
			return fmt.Errorf("size check: got %v", err)
		}
		if err := allReduce(g, b, 9); err == nil || codeOf(err) != errInvalidArg {
			return fmt.Errorf("bad op: got %v", err)
		}
		return barrier(g)
	})
	require.NoError(t, err)
}

func TestWorldOfOneWithoutLauncher(t *testing.T) {
	for _, k := range []string{"RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"} {
		t.Setenv(k, "")
		require.NoError(t, os.Unsetenv(k))
	}
	rank, size, err := apiDistInit()
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1}, []int{rank, size})
	buf := []float32{1, -2, 3.5}
	require.NoError(t, withWorld(func(g comm.Group) error { return allReduce(g, buf, 0) }))
	assert.Equal(t, []float32{1, -2, 3.5}, buf)
	out := make([]float32, 3)
	require.NoError(t, withWorld(func(g comm.Group) error { return allGather(g, buf, out) }))
	assert.Equal(t, buf, out)
	require.NoError(t, apiDistFinalize())
}

func TestCallRecoversPanicsIntoThreadLocalErrors(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	status := call(func() error { panic("boom") })
	assert.Equal(t, errInternal, int(status))
	assert.Contains(t, lastError(), "tinyacc: internal error: boom")

	status = call(func() error { return fail(errSize, "too small") })
	assert.Equal(t, errSize, int(status))
	assert.Equal(t, "too small", lastError())

	// Another thread has its own last error.
	done := make(chan string)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		call(func() error { return errors.New("other thread") })
		done <- lastError()
	}()
	assert.Equal(t, "other thread", <-done)
	assert.Equal(t, "too small", lastError())
	assert.Equal(t, errRuntime, codeOf(errors.New("plain")))
}

// TestReduceScatterAsBF16RoundsOnce: reduce_scatter_as with "bf16" sums the
// ranks' bf16-rounded blocks in float32 and rounds the average once, and
// sends half the bytes of the float32 form. 256 + 0.75 + 0.75 averaged over
// 3 ranks is 85.83, 86 in bf16; rounding each partial sum would give 256,
// 256, then 85.33, 85.5 in bf16. Inputs that are not bf16 values are
// rounded first (1 + 2^-10 → 1).
func TestReduceScatterAsBF16RoundsOnce(t *testing.T) {
	const world = 3
	err := comm.RunLocal(world, comm.Options{}, func(g comm.Group) error {
		in := make([]float32, world*2)
		for blk := 0; blk < world; blk++ {
			in[blk*2] = []float32{256, 0.75, 0.75}[g.Rank()]
			in[blk*2+1] = 1 + 1.0/1024
		}
		bc := g.(comm.ByteCounter)
		before := bc.SentBytes()
		out := make([]float32, 2)
		if err := reduceScatterAs(g, in, out, 1, tensor.BFloat16); err != nil {
			return err
		}
		half := bc.SentBytes() - before
		if out[0] != 86 || out[1] != 1 {
			return fmt.Errorf("rank %d: bf16 reduce-scatter gave %v, want [86 1]", g.Rank(), out)
		}
		before = bc.SentBytes()
		if err := reduceScatterAs(g, in, out, 1, tensor.Float32); err != nil {
			return err
		}
		if full := bc.SentBytes() - before; half*2 != full {
			return fmt.Errorf("rank %d: bf16 sent %d bytes, fp32 %d: want half", g.Rank(), half, full)
		}
		if _, err := reduceDTypeOf("fp16"); err == nil || err.Error() != `reduce_scatter_as: "fp16" is not a reduce dtype: use fp32 or bf16 (ddp.reduce_dtype)` {
			return fmt.Errorf("bad dtype: got %v", err)
		}
		return nil
	})
	require.NoError(t, err)
}
