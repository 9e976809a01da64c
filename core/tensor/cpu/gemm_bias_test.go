package cpu

import (
	"fmt"
	"testing"
)

// TestGemmRoundAHalfBBias: the product with its bias added as C is stored
// is bitwise GemmRoundAHalfB (beta 0) followed by AddBias, in every layout
// of the half-precision cases (k past one k block of the kernel, n past
// and inside a panel, C with a row stride past n), for bf16 and fp16; and
// whatever C held before is not read.
func TestGemmRoundAHalfBBias(t *testing.T) {
	rng := newRNG(21)
	for _, h := range halfCases() {
		for _, f16 := range []bool{false, true} {
			round := BF16FromF32
			if f16 {
				round = F16FromF32
			}
			bb := convert(h.b, round)
			bias := randSlice[float32](rng, h.n, 1)
			want := append([]float32(nil), h.c...)
			GemmRoundAHalfB(f16, h.ta, h.tb, h.m, h.n, h.k, h.alpha, h.a, h.lda, bb, h.ldb, 0, want, h.ldc)
			for r := range h.m {
				AddBias(want[r*h.ldc:r*h.ldc+h.n], bias, 1, h.n)
			}
			got := randSlice[float32](rng, len(h.c), 1)
			for r := range h.m { // the columns past n keep what they held
				copy(got[r*h.ldc+h.n:(r+1)*h.ldc], want[r*h.ldc+h.n:(r+1)*h.ldc])
			}
			GemmRoundAHalfBBias(f16, h.ta, h.tb, h.m, h.n, h.k, h.alpha, h.a, h.lda, bb, h.ldb, bias, got, h.ldc)
			requireSameBits(t, got, want, fmt.Sprintf("f16 %v %s", f16, h.name))
		}
	}
}

// TestGemmHalfOperandBias: with A already in bf16 (H) the product with its
// bias is bitwise GemmRoundAHalfBBias on the float32 A those halves were
// rounded from, on the kernel's path and the portable one, and with A
// float32 it is GemmRoundAHalfBBias itself.
func TestGemmHalfOperandBias(t *testing.T) {
	rng := newRNG(31)
	for _, kernel := range []bool{true, false} {
		was := SetBF16Kernel(kernel)
		for _, h := range halfCases() {
			if h.beta != 0 {
				continue
			}
			bb := convert(h.b, BF16FromF32)
			bias := randSlice[float32](rng, h.n, 1)
			name := fmt.Sprintf("%s kernel %v", h.name, HalfKernel(false))
			want := append([]float32(nil), h.c...)
			GemmRoundAHalfBBias(false, h.ta, h.tb, h.m, h.n, h.k, h.alpha, h.a, h.lda, bb, h.ldb, bias, want, h.ldc)
			for _, a := range []HalfOperand{{H: convert(h.a, BF16FromF32)}, {F: h.a}} {
				got := append([]float32(nil), h.c...)
				GemmHalfOperandBias(false, h.ta, h.tb, h.m, h.n, h.k, h.alpha, a, h.lda, bb, h.ldb, bias, got, h.ldc)
				requireSameBits(t, got, want, fmt.Sprintf("%s A stored %v", name, a.H != nil))
			}
		}
		SetBF16Kernel(was)
	}
}
