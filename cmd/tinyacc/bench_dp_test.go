package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/trace"
)

func TestHiddenShare(t *testing.T) {
	evs := []trace.Event{
		{Ph: "X", TID: trace.Compute, TS: 0, Dur: 10}, // forward
		{Ph: "X", TID: trace.Compute, TS: 8, Dur: 12}, // backward, overlapping: union [0, 20]
		{Ph: "X", TID: trace.Comm, TS: 15, Dur: 10},   // 5 of 10 hidden
		{Ph: "X", TID: trace.Comm, TS: 30, Dur: 10},   // 0 of 10 hidden
		{Ph: "M", TID: trace.Comm, TS: 0, Dur: 100},   // metadata: ignored
		{Ph: "X", TID: trace.Compute, TS: 35, Dur: 2}, // optimizer: 2 of the second span
	}
	require.InDelta(t, 7.0/20.0, HiddenShare(evs), 1e-12)
	require.Equal(t, 0.0, HiddenShare(nil))
}

func TestDPFormula(t *testing.T) {
	psi := 1000.0
	require.Equal(t, 16*psi, dpFormulaBytes(psi, 4, 0))
	require.Equal(t, 4*psi+4*psi+2*psi, dpFormulaBytes(psi, 4, 1))
	require.Equal(t, 4*psi+psi+2*psi, dpFormulaBytes(psi, 4, 2))
	require.Equal(t, 4*psi, dpFormulaBytes(psi, 4, 3))
}

func TestZeroWorkingSet(t *testing.T) {
	c := nn.GPTConfig{NLayer: 6, NHead: 6, NEmbd: 384, BlockSize: 128, VocabSize: 256}
	embed, block := 384.0*384, 12*384.0*384+13*384
	require.Equal(t, 0.0, zeroWorkingSet(c, 1))
	require.Equal(t, 4*(embed+2*block), zeroWorkingSet(c, 2))
	require.Equal(t, 4*(embed+2*block)+4*(2*block), zeroWorkingSet(c, 3))
	wide := nn.GPTConfig{NLayer: 2, NHead: 2, NEmbd: 32, BlockSize: 16, VocabSize: 50257}
	wEmbed, wBlock := float64(50257+16)*32, 12*32.0*32+13*32
	require.Equal(t, 4*(wEmbed+2*wBlock)+4*(wEmbed+wBlock+2*32), zeroWorkingSet(wide, 3))
}

// The layout bench's formulas: dp all-reduces 4Ψ bytes and the loss, tp
// and tp + SP send tp.StepBytes of the whole global batch; all add the
// gradient norm's all-reduce.
func TestLayoutFormulas(t *testing.T) {
	b := layoutBench{model: nn.GPTConfig{NLayer: 2, NHead: 4, NEmbd: 64, BlockSize: 32, VocabSize: 256}, global: 8}
	psi := float64(b.model.NumParams())
	require.Equal(t, 4*psi+8+16, dpCommBytes(b, 2))
	V := 8.0 * 32 * 64
	require.Equal(t, 4*((4*2+2)*V+3*8*32)+16, tpCommBytes(false)(b, 2))
	require.Equal(t, 0.5*4*(8*2+4)*V+4*(3*8*32+(6*2+2)*64+32*64)+16, tpCommBytes(true)(b, 2))
	require.Equal(t, tpCommBytes(false)(b, 2)-16, tpCommBytes(true)(b, 2)-16-4*(14*64+32*64),
		"the activation volume of plain tp and sp is equal")
}

// `tinyacc bench dp` prints one row per variant: the hidden share is a
// percentage, the formula and +buffers columns are dpFormulaBytes and
// zeroWorkingSet of the model, and "vs both" is the measured steady
// memory against +buffers.
func TestBenchDP(t *testing.T) {
	bin := tinyaccBinary(t)
	cmd := exec.Command(bin, "bench", "dp", "--nproc", "2", "--steps", "2", "--repeats", "1",
		"--n_layer", "1", "--n_embd", "32", "--n_head", "2", "--block_size", "16", "--batch", "2")
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "%s", stderr.String())
	lines := strings.Split(stdout.String(), "\n")
	require.Greater(t, len(lines), 2+len(dpVariants), stdout.String())
	require.Equal(t, "  dp variant         ms/step   hidden   steady MiB  formula MiB +buffers MiB    vs both", lines[1])
	gc := nn.GPTConfig{NLayer: 1, NHead: 2, NEmbd: 32, BlockSize: 16, VocabSize: 256}
	psi := float64(gc.NumParams())
	row := regexp.MustCompile(`^ +2 (.{13}) +(\d+\.\d) +(\d+)% +(\d+\.\d\d) +(\d+\.\d\d) +(\d+\.\d\d) +([+-]\d+\.\d)%$`)
	for i, v := range dpVariants {
		m := row.FindStringSubmatch(lines[2+i])
		require.NotNil(t, m, "row of %s: %q", v.name, lines[2+i])
		require.Equal(t, v.name, strings.TrimSpace(m[1]))
		num := func(k int) float64 {
			x, err := strconv.ParseFloat(m[k], 64)
			require.NoError(t, err)
			return x
		}
		require.Positive(t, num(2), "%s: ms/step", v.name)
		require.LessOrEqual(t, num(3), 100.0, "%s: hidden share", v.name)
		steady := num(4)
		require.Positive(t, steady, "%s: steady memory", v.name)
		formula := dpFormulaBytes(psi, 2, v.stage)
		want := formula + zeroWorkingSet(gc, v.stage)
		require.Equal(t, fmt.Sprintf("%.2f", formula/(1<<20)), m[5], "%s: formula MiB", v.name)
		require.Equal(t, fmt.Sprintf("%.2f", want/(1<<20)), m[6], "%s: +buffers MiB", v.name)
		// steady is printed to 0.01 MiB, "vs both" from the unrounded value.
		require.InDelta(t, 100*(steady*(1<<20)-want)/want, num(7), 0.05+100*0.005*(1<<20)/want, "%s: vs both", v.name)
	}
	require.Equal(t, "hidden: share of rank 0's communication time that overlaps forward/backward/optimizer spans", lines[2+len(dpVariants)])
}
