package cpu

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHalfSpan: products over runs of rows of one packing (prefixes,
// suffixes and runs inside, from even and odd rows, to the end of an odd
// number of rows) are bitwise gemmHalfSerial's on those rows, A
// transposed or not, beta 0 (C not read) and 1, on both formats; on the
// bf16 kernel the rows are packed once.
func TestHalfSpan(t *testing.T) {
	rng := newRNG(23)
	for _, f16 := range []bool{false, true} {
		for _, sz := range [][3]int{{5, 3, 4}, {64, 256, 64}, {13, 45, 33}, {12, 97, 64}} {
			m, rows, cols := sz[0], sz[1], sz[2]
			ldx, ldc := 3*cols+1, cols+2
			x := randSlice[float32](rng, rows*ldx, 1)
			h := newHalfSpan(f16, x, ldx, rows, cols)
			require.Equal(t, bf16Kernel.Load() && !f16, h.packed != nil, "f16 %v: packed once on the bf16 kernel", f16)
			for _, run := range [][2]int{{0, rows}, {0, rows / 2 * 2}, {2, rows - 2}, {rows / 2 * 2, rows - rows/2*2}, {1, rows - 1}, {0, 3}, {2, 1}} {
				r0, k := run[0], run[1]
				for _, ta := range []bool{false, true} {
					ar, lda := m, k+1 // op(A) is m x k, stored transposed when ta
					if ta {
						ar, lda = k, m+3
					}
					a := randSlice[float32](rng, max(1, ar)*lda, 1)
					for _, beta := range []float32{0, 1} {
						want := randSlice[float32](rng, m*ldc, 1)
						got := append([]float32(nil), want...)
						gemmHalfSerial(f16, ta, false, m, cols, k, 0.5, a, lda, x[r0*ldx:], ldx, beta, want, ldc)
						h.mul(ta, m, r0, k, 0.5, a, lda, beta, got, ldc)
						require.Equal(t, want, got, "f16 %v m %d rows %d cols %d run [%d,%d) ta %v beta %v", f16, m, rows, cols, r0, r0+k, ta, beta)
					}
				}
			}
			h.release()
		}
	}
}
