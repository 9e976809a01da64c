package cpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// naiveGemm is the textbook triple loop in float64 on the stored matrices.
func naiveGemm(transA, transB bool, m, n, k int, alpha float64, a []float64, lda int, b []float64, ldb int, beta float64, c []float64, ldc int) []float64 {
	out := append([]float64(nil), c...)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float64
			for p := 0; p < k; p++ {
				var av, bv float64
				if transA {
					av = a[p*lda+i]
				} else {
					av = a[i*lda+p]
				}
				if transB {
					bv = b[j*ldb+p]
				} else {
					bv = b[p*ldb+j]
				}
				s += av * bv
			}
			if beta == 0 {
				out[i*ldc+j] = alpha * s
			} else {
				out[i*ldc+j] = alpha*s + beta*c[i*ldc+j]
			}
		}
	}
	return out
}

func testGemm[T Float](t *testing.T) {
	rng := newRNG(1)
	sizes := [][3]int{{1, 1, 1}, {3, 5, 7}, {4, 4, 4}, {17, 13, 9}, {65, 33, 300}, {70, 1030, 5}, {130, 67, 513}}
	for _, sz := range sizes {
		m, n, k := sz[0], sz[1], sz[2]
		for _, ta := range []bool{false, true} {
			for _, tb := range []bool{false, true} {
				for _, ab := range [][2]float64{{1, 0}, {0.5, 1}, {-1.5, 0.25}} {
					name := fmt.Sprintf("m%d_n%d_k%d_ta%v_tb%v_a%v_b%v", m, n, k, ta, tb, ab[0], ab[1])
					// Stored shapes with padded strides, to exercise lda/ldb/ldc.
					ar, ac := m, k
					if ta {
						ar, ac = k, m
					}
					br, bc := k, n
					if tb {
						br, bc = n, k
					}
					lda, ldb, ldc := ac+3, bc+1, n+2
					a := randSlice[T](rng, ar*lda, 1)
					b := randSlice[T](rng, br*ldb, 1)
					c := randSlice[T](rng, m*ldc, 1)
					want := naiveGemm(ta, tb, m, n, k, ab[0], to64(a), lda, to64(b), ldb, ab[1], to64(c), ldc)
					Gemm(ta, tb, m, n, k, T(ab[0]), a, lda, b, ldb, T(ab[1]), c, ldc)
					requireClose(t, c, want, tolFor[T](1e-6, 1e-14), name)
				}
			}
		}
	}
}

func TestGemmFloat32(t *testing.T) { testGemm[float32](t) }
func TestGemmFloat64(t *testing.T) { testGemm[float64](t) }

func TestGemmPureGo(t *testing.T) {
	// The pure-Go kernel also backs attention-sized products in every build;
	// check it directly even when OpenBLAS serves Gemm.
	rng := newRNG(2)
	for _, sz := range [][3]int{{1, 1, 1}, {5, 3, 2}, {67, 129, 257}, {64, 1025, 64}} {
		m, n, k := sz[0], sz[1], sz[2]
		for _, tb := range []bool{false, true} {
			a := randSlice[float64](rng, m*k, 1)
			b := randSlice[float64](rng, k*n, 1)
			ldb := n
			if tb {
				ldb = k
			}
			c := randSlice[float64](rng, m*n, 1)
			want := naiveGemm(false, tb, m, n, k, 0.75, a, k, b, ldb, -2, c, n)
			gemmGo(false, tb, m, n, k, 0.75, a, k, b, ldb, -2, c, n)
			requireClose(t, c, want, 1e-14, fmt.Sprint(sz, tb))
		}
	}
}

func TestGemmBetaZeroIgnoresNaN(t *testing.T) {
	c := []float32{float32(math.NaN()), float32(math.Inf(1))}
	Gemm(false, false, 1, 2, 1, 1, []float32{2}, 1, []float32{3, 4}, 2, 0, c, 2)
	require.Equal(t, []float32{6, 8}, c)
}

func TestGemmZeroK(t *testing.T) {
	c := []float64{1, 2, 3, 4}
	Gemm(false, false, 2, 2, 0, 1, nil, 1, nil, 2, 0.5, c, 2)
	require.Equal(t, []float64{0.5, 1, 1.5, 2}, c)
}

func TestGemmBadArguments(t *testing.T) {
	require.PanicsWithValue(t,
		"cpu.Gemm: a is stored 2x3 but its row stride lda=2 is below 3; pass the stored row length",
		func() {
			Gemm(false, false, 2, 2, 3, 1, make([]float32, 6), 2, make([]float32, 6), 2, 0, make([]float32, 4), 2)
		})
	require.PanicsWithValue(t,
		"cpu.Gemm: c is stored 2x2 with row stride 2, which needs 4 elements, but the slice has 3",
		func() {
			Gemm(false, false, 2, 2, 3, 1, make([]float32, 6), 3, make([]float32, 6), 2, 0, make([]float32, 3), 2)
		})
}

func TestGemmThreadsDeterministic(t *testing.T) {
	rng := newRNG(3)
	m, n, k := 300, 200, 700
	a := randSlice[float32](rng, m*k, 1)
	b := randSlice[float32](rng, k*n, 1)
	var c1, c2 []float32
	withThreads(1, func() { c1 = make([]float32, m*n); gemmGo(false, false, m, n, k, 1, a, k, b, n, 0, c1, n) })
	withThreads(2, func() { c2 = make([]float32, m*n); gemmGo(false, false, m, n, k, 1, a, k, b, n, 0, c2, n) })
	require.Equal(t, c1, c2)
}
