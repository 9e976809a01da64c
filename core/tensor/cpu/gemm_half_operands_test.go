package cpu

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGemmHalfOperands: a product whose operands were rounded once
// (RoundHalfOnce) gives the bits of the product that rounds them as it
// reads them, each operand float32, rounded once or stored as halves, on
// the kernel's path and the portable one, in bf16 and fp16; on the
// portable path RoundHalfOnce holds the rounded values, with the kernel
// it is the operand itself, which the kernel rounds as it packs.
func TestGemmHalfOperands(t *testing.T) {
	for _, kernel := range []bool{true, false} {
		was := SetBF16Kernel(kernel)
		for _, h := range halfCases() {
			ar, br := h.m, h.k
			if h.ta {
				ar = h.k
			}
			if h.tb {
				br = h.n
			}
			for _, f16 := range []bool{false, true} {
				narrow, widen, gemmRound := BF16FromF32, BF16ToF32, GemmRoundBF16
				if f16 {
					narrow, widen, gemmRound = F16FromF32, F16ToF32, GemmRoundF16
				}
				name := fmt.Sprintf("%s f16 %v kernel %v", h.name, f16, HalfKernel(f16))
				want := append([]float32(nil), h.c...)
				gemmRound(h.ta, h.tb, h.m, h.n, h.k, h.alpha, h.a, h.lda, h.b, h.ldb, h.beta, want, h.ldc)

				aOnce, doneA := RoundHalfOnce(f16, h.a, ar, h.lda)
				bOnce, doneB := RoundHalfOnce(f16, h.b, br, h.ldb)
				require.Equal(t, !HalfKernel(f16), aOnce.Exact, name)
				if aOnce.Exact {
					for i, v := range h.a {
						require.Equal(t, widen(narrow(v)), aOnce.F[i], "%s: element %d", name, i)
					}
				} else {
					require.Same(t, &h.a[0], &aOnce.F[0], name)
				}
				for _, ops := range [][2]HalfOperand{
					{aOnce, {F: h.b}},
					{{F: h.a}, bOnce},
					{aOnce, bOnce},
					{aOnce, {H: convert(h.b, narrow)}},
					{{H: convert(h.a, narrow)}, bOnce},
					{{F: h.a}, {H: convert(h.b, narrow)}},
				} {
					c := append([]float32(nil), h.c...)
					GemmHalfOperands(f16, h.ta, h.tb, h.m, h.n, h.k, h.alpha, ops[0], h.lda, ops[1], h.ldb, h.beta, c, h.ldc)
					requireSameBits(t, c, want, fmt.Sprintf("%s exact A %v B %v, B stored %v", name, ops[0].Exact, ops[1].Exact, ops[1].H != nil))
				}
				doneA()
				doneB()
			}
		}
		SetBF16Kernel(was)
	}
}
