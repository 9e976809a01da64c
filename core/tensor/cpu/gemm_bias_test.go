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
