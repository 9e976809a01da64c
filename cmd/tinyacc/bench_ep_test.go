package main

import (
	"bytes"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/nn"
)

// `tinyacc bench ep` runs its three jobs as processes and fails when any
// step's bytes differ from the formula; 2 ranks, 3 steps, a narrow model.
func TestBenchEP(t *testing.T) {
	bin := tinyaccBinary(t)
	cmd := exec.Command(bin, "bench", "ep", "--nproc", "2", "--steps", "3", "--n_embd", "32", "--block_size", "16", "--batch", "2")
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "%s\n%s", stdout.String(), stderr.String())
	for _, row := range []string{"\ndense ", "\nmoe aux 0.01 ", "\nmoe aux 0 "} {
		require.Contains(t, stdout.String(), row)
	}
}

// The formula's terms by hand for a 1-block MoE of width 8 with 2 experts
// on 2 ranks: rows, counts, the aux statistics, the load counts, and the
// all-reduces of the replicated parameters, the loss and the norm (all
// under 32 KiB: each sent once to the other rank).
func TestEPCommBytesFormula(t *testing.T) {
	m := nn.GPTConfig{NLayer: 1, NHead: 1, NEmbd: 8, BlockSize: 4, VocabSize: 16,
		MoE: nn.MoEConfig{Experts: 2, TopK: 1, Every: 1, AuxLossCoef: 0.01}}
	psi := float64(16*8 + 4*8 + (2*8 + 3*8*8 + 3*8 + 8*8 + 8 + 2*8) + 8*2 + 2*8) // wte, wpe, ln_1 attn ln_2, router, ln_f
	require.Equal(t, int64(psi), replicatedParams(m))
	want := 2*4*8*10.0 + 8*2*0.5 + 8*6 + 8*3 + 4*psi + 8 + 16
	require.Equal(t, want, epCommBytes(m, 2, 1, 10))
}
