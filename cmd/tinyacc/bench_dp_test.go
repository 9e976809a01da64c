package main

import (
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
	require.Equal(t, 8*(embed+2*block), zeroWorkingSet(c, 3))
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
