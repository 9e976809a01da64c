package cpu

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// halfCase is one product of the half-precision tests: stored operands with
// padded strides, as testGemm builds them.
type halfCase struct {
	ta, tb        bool
	m, n, k       int
	lda, ldb, ldc int
	alpha, beta   float32
	a, b, c       []float32
	name          string
}

func halfCases() []halfCase {
	rng := newRNG(11)
	var out []halfCase
	sizes := [][3]int{{1, 1, 1}, {3, 5, 7}, {12, 32, 2}, {13, 33, 3}, {17, 13, 9}, {65, 33, 300}, {70, 100, 5}, {200, 67, 513}, {25, 70, 1100}}
	for _, sz := range sizes {
		m, n, k := sz[0], sz[1], sz[2]
		for _, ta := range []bool{false, true} {
			for _, tb := range []bool{false, true} {
				for _, ab := range [][2]float32{{1, 0}, {-1.5, 0.25}} {
					ar, ac := m, k
					if ta {
						ar, ac = k, m
					}
					br, bc := k, n
					if tb {
						br, bc = n, k
					}
					lda, ldb, ldc := ac+3, bc+1, n+2
					out = append(out, halfCase{ta: ta, tb: tb, m: m, n: n, k: k, lda: lda, ldb: ldb, ldc: ldc,
						alpha: ab[0], beta: ab[1],
						a: randSlice[float32](rng, ar*lda, 1), b: randSlice[float32](rng, br*ldb, 1), c: randSlice[float32](rng, m*ldc, 1),
						name: fmt.Sprintf("m%d_n%d_k%d_ta%v_tb%v_a%v_b%v", m, n, k, ta, tb, ab[0], ab[1])})
				}
			}
		}
	}
	return out
}

func (h halfCase) want(a, b []float32) []float64 {
	return naiveGemm(h.ta, h.tb, h.m, h.n, h.k, float64(h.alpha), to64(a), h.lda, to64(b), h.ldb, float64(h.beta), to64(h.c), h.ldc)
}

func convert(x []float32, f func(float32) uint16) []uint16 {
	out := make([]uint16, len(x))
	for i, v := range x {
		out[i] = f(v)
	}
	return out
}

func widenAll(x []uint16, f func(uint16) float32) []float32 {
	out := make([]float32, len(x))
	for i, v := range x {
		out[i] = f(v)
	}
	return out
}

// TestGemmHalfAgainstFloat32 holds the half products to the float32 product
// of the unrounded inputs (norm-wise 1e-2 for bf16's 8-bit significand, 2e-3
// for fp16's 11 bits), and to the exact product of the rounded inputs at
// float32 accumulation accuracy (1e-5), which is what catches a wrong
// element, stride or transpose inside the kernel.
func TestGemmHalfAgainstFloat32(t *testing.T) {
	for _, h := range halfCases() {
		ab, bb := convert(h.a, BF16FromF32), convert(h.b, BF16FromF32)
		c := append([]float32(nil), h.c...)
		GemmBF16(h.ta, h.tb, h.m, h.n, h.k, h.alpha, ab, h.lda, bb, h.ldb, h.beta, c, h.ldc)
		requireClose(t, c, h.want(h.a, h.b), 1e-2, "bf16 vs float32 "+h.name)
		requireClose(t, c, h.want(widenAll(ab, BF16ToF32), widenAll(bb, BF16ToF32)), 1e-5, "bf16 vs exact "+h.name)

		cr := append([]float32(nil), h.c...)
		GemmRoundBF16(h.ta, h.tb, h.m, h.n, h.k, h.alpha, h.a, h.lda, h.b, h.ldb, h.beta, cr, h.ldc)
		require.Equal(t, c, cr, "GemmRoundBF16 equals GemmBF16 of the rounded inputs, "+h.name)
		cr = append(cr[:0], h.c...)
		GemmRoundAHalfB(false, h.ta, h.tb, h.m, h.n, h.k, h.alpha, h.a, h.lda, bb, h.ldb, h.beta, cr, h.ldc)
		require.Equal(t, c, cr, "GemmRoundAHalfB equals GemmBF16 of the rounded inputs, "+h.name)
		cr = append(cr[:0], h.c...)
		GemmHalfARoundB(false, h.ta, h.tb, h.m, h.n, h.k, h.alpha, ab, h.lda, h.b, h.ldb, h.beta, cr, h.ldc)
		requireSameBits(t, cr, c, "GemmHalfARoundB equals GemmBF16 of the rounded inputs, "+h.name)

		ah, bh := convert(h.a, F16FromF32), convert(h.b, F16FromF32)
		c = append(c[:0], h.c...)
		GemmF16(h.ta, h.tb, h.m, h.n, h.k, h.alpha, ah, h.lda, bh, h.ldb, h.beta, c, h.ldc)
		requireClose(t, c, h.want(h.a, h.b), 2e-3, "fp16 vs float32 "+h.name)
		requireClose(t, c, h.want(widenAll(ah, F16ToF32), widenAll(bh, F16ToF32)), 1e-5, "fp16 vs exact "+h.name)

		cr = append(cr[:0], h.c...)
		GemmRoundF16(h.ta, h.tb, h.m, h.n, h.k, h.alpha, h.a, h.lda, h.b, h.ldb, h.beta, cr, h.ldc)
		require.Equal(t, c, cr, "GemmRoundF16 equals GemmF16 of the rounded inputs, "+h.name)
		cr = append(cr[:0], h.c...)
		GemmRoundAHalfB(true, h.ta, h.tb, h.m, h.n, h.k, h.alpha, h.a, h.lda, bh, h.ldb, h.beta, cr, h.ldc)
		require.Equal(t, c, cr, "GemmRoundAHalfB equals GemmF16 of the rounded inputs, "+h.name)
		cr = append(cr[:0], h.c...)
		GemmHalfARoundB(true, h.ta, h.tb, h.m, h.n, h.k, h.alpha, ah, h.lda, h.b, h.ldb, h.beta, cr, h.ldc)
		requireSameBits(t, cr, c, "GemmHalfARoundB equals GemmF16 of the rounded inputs, "+h.name)
	}
}

// TestGemmHalfSerial: the attention's product on the calling goroutine
// (every transpose, beta 0 and not) is GemmRoundBF16's and GemmRoundF16's:
// bitwise on the bf16 kernel where it runs, which sums each element in
// the same order however the rows are split, and to float32 accumulation
// accuracy of the exact product of the rounded inputs on the portable
// path (TINYACC_BF16_KERNEL=off included).
func TestGemmHalfSerial(t *testing.T) {
	for _, h := range halfCases() {
		for _, f16 := range []bool{false, true} {
			round, gemm, name := BF16FromF32, GemmRoundBF16, "bf16 "+h.name
			if f16 {
				round, gemm, name = F16FromF32, GemmRoundF16, "fp16 "+h.name
			}
			c, cs := append([]float32(nil), h.c...), append([]float32(nil), h.c...)
			gemm(h.ta, h.tb, h.m, h.n, h.k, h.alpha, h.a, h.lda, h.b, h.ldb, h.beta, c, h.ldc)
			gemmHalfSerial(f16, h.ta, h.tb, h.m, h.n, h.k, h.alpha, h.a, h.lda, h.b, h.ldb, h.beta, cs, h.ldc)
			if bf16Kernel.Load() && !f16 {
				require.Equal(t, c, cs, name)
			}
			wide := func(x []float32) []float32 {
				if f16 {
					return widenAll(convert(x, round), F16ToF32)
				}
				return widenAll(convert(x, round), BF16ToF32)
			}
			requireClose(t, cs, h.want(wide(h.a), wide(h.b)), 1e-5, name)
		}
	}
}

// TestHalfKeys: products over prefixes of rows rounded (or packed) once
// are bitwise gemmHalfSerial's on those rows, for every prefix, on both
// formats and at row counts that end inside and on a panel of the bf16
// kernel.
func TestHalfKeys(t *testing.T) {
	rng := newRNG(13)
	for _, f16 := range []bool{false, true} {
		for _, sz := range [][3]int{{5, 3, 4}, {64, 256, 64}, {70, 45, 33}, {12, 96, 64}} {
			m, rows, cols := sz[0], sz[1], sz[2]
			lda, ldx, ldc := cols+3, 3*cols+1, rows+2
			a, x := randSlice[float32](rng, m*lda, 1), randSlice[float32](rng, rows*ldx, 1)
			h := newHalfKeys(f16, x, ldx, rows, cols)
			for _, n := range []int{1, rows / 3, rows/2 + 1, rows} {
				want, got := randSlice[float32](rng, m*ldc, 1), randSlice[float32](rng, m*ldc, 1)
				copy(got, want) // beta 0: what C held is not read
				gemmHalfSerial(f16, false, true, m, n, cols, 0.5, a, lda, x, ldx, 0, want, ldc)
				h.mul(m, n, 0.5, a, lda, got, ldc)
				require.Equal(t, want, got, "f16 %v m %d rows %d cols %d n %d", f16, m, rows, cols, n)
			}
			h.release()
		}
	}
}

// TestRoundF16: roundF16 (the Go loops' fp16 rounding) is the two
// conversions F16ToF32(F16FromF32(x)), bit for bit, on
// every float32 whose low 16 bits are one of the patterns around fp16's
// rounding points (its ties among them), and on random ones.
func TestRoundF16(t *testing.T) {
	check := func(u uint32) {
		x := math.Float32frombits(u)
		want, got := F16ToF32(F16FromF32(x)), roundF16(x)
		if math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("roundF16(%#08x) = %#08x, F16ToF32(F16FromF32) %#08x", u, math.Float32bits(got), math.Float32bits(want))
		}
	}
	for hi := uint32(0); hi < 1<<16; hi++ {
		for _, lo := range []uint32{0, 1, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x3000, 0x7fff, 0x8000, 0x8001, 0xffff} {
			check(hi<<16 | lo)
		}
	}
	rng := newRNG(14)
	for range 1 << 20 {
		check(rng.Uint32())
	}
}

// TestGemmBF16PathsAgree: the AVX512-BF16 kernel and the portable path
// compute the same exact products and differ only in float32 summation
// order. Skipped where the CPU has no AVX512-BF16 (only the portable path
// exists there, and TestGemmHalfAgainstFloat32 covers it).
func TestGemmBF16PathsAgree(t *testing.T) {
	if !bf16Native {
		t.Skip("no AVX512-BF16 kernel on this CPU or build: " + HalfGemmPath())
	}
	for _, h := range halfCases() {
		ab, bb := convert(h.a, BF16FromF32), convert(h.b, BF16FromF32)
		c1, c2 := append([]float32(nil), h.c...), append([]float32(nil), h.c...)
		GemmBF16(h.ta, h.tb, h.m, h.n, h.k, h.alpha, ab, h.lda, bb, h.ldb, h.beta, c1, h.ldc)
		gemmHalfWiden(h.ta, h.tb, h.m, h.n, h.k, h.alpha, halfOperand{h: ab}, h.lda, halfOperand{h: bb}, h.ldb, h.beta, c2, h.ldc)
		requireClose(t, c1, to64(c2), 1e-5, h.name)
	}
}

func TestGemmBF16ThreadsDeterministic(t *testing.T) {
	rng := newRNG(12)
	m, n, k := 300, 200, 700
	a := convert(randSlice[float32](rng, m*k, 1), BF16FromF32)
	b := convert(randSlice[float32](rng, k*n, 1), BF16FromF32)
	var c1, c2 []float32
	withThreads(1, func() { c1 = make([]float32, m*n); GemmBF16(false, true, m, n, k, 1, a, k, b, k, 0, c1, n) })
	withThreads(2, func() { c2 = make([]float32, m*n); GemmBF16(false, true, m, n, k, 1, a, k, b, k, 0, c2, n) })
	require.Equal(t, c1, c2)
}

func TestGemmHalfBetaZeroIgnoresNaN(t *testing.T) {
	nan := float32(math.NaN())
	c := []float32{nan, float32(math.Inf(1))}
	GemmBF16(false, false, 1, 2, 1, 1, []uint16{BF16FromF32(2)}, 1, []uint16{BF16FromF32(3), BF16FromF32(4)}, 2, 0, c, 2)
	require.Equal(t, []float32{6, 8}, c)
	c = []float32{nan, nan}
	GemmF16(false, false, 1, 2, 1, 1, []uint16{F16FromF32(2)}, 1, []uint16{F16FromF32(3), F16FromF32(4)}, 2, 0, c, 2)
	require.Equal(t, []float32{6, 8}, c)
}

func TestGemmHalfBadArguments(t *testing.T) {
	require.PanicsWithValue(t,
		"cpu.Gemm: a is stored 2x3 but its row stride lda=2 is below 3; pass the stored row length",
		func() {
			GemmBF16(false, false, 2, 2, 3, 1, make([]uint16, 6), 2, make([]uint16, 6), 2, 0, make([]float32, 4), 2)
		})
}

// TestGemmRoundBF16SpecialValues: a product that selects one row of B
// (A = [1 0] or [0 1]) gives back B's numbers rounded to bf16 exactly as
// BF16FromF32 rounds them, ties to even, the largest float32 to infinity,
// infinities kept, in every packing of B (stored or transposed, full
// panels and the columns past them). Of the subnormals only those that
// round up to the smallest normal bf16 are in (VDPBF16PS treats subnormal
// inputs as zero): the packing rounds them itself rather than flush them.
func TestGemmRoundBF16SpecialValues(t *testing.T) {
	bits := []uint32{0x3f808000, 0x3f818000, 0x3f80c000, 0x7f7fffff, 0xff7fffff, 0x3f80bfff, 0x3f808001, 0,
		0x7f800000, 0xff800000, 0x3f7fffff, 0x477fe000, 0xc2fe8000, 0x00800000, 0x80800000, 0x007fffff, 0x807f8000}
	n := 70 // two full panels of 32 columns and 6 past them
	row := make([]float32, n)
	for j := range row {
		row[j] = math.Float32frombits(bits[j%len(bits)])
	}
	finite := make([]float32, n)
	for j := range finite {
		finite[j] = float32(j) - 3.25
	}
	for _, tb := range []bool{false, true} {
		for sel := 0; sel < 2; sel++ {
			rows := [2][]float32{finite, finite}
			rows[sel] = row
			b := make([]float32, 2*n) // k = 2 rows of n
			for i := 0; i < 2; i++ {
				for j := 0; j < n; j++ {
					if tb {
						b[j*2+i] = rows[i][j]
					} else {
						b[i*n+j] = rows[i][j]
					}
				}
			}
			ldb := n
			if tb {
				ldb = 2
			}
			a := []float32{0, 0}
			a[sel] = 1
			c := make([]float32, n)
			GemmRoundBF16(false, tb, 1, n, 2, 1, a, 2, b, ldb, 0, c, n)
			for j := range c {
				want := BF16ToF32(BF16FromF32(row[j]))
				require.Equal(t, math.Float32bits(want), math.Float32bits(c[j]), "tb=%v row %d column %d: %x", tb, sel, j, math.Float32bits(row[j]))
			}
		}
	}
}

// TestGemmHalfPortablePath: with the bf16 kernel turned off
// (TINYACC_BF16_KERNEL=off, SetBF16Kernel) a bf16 product is bitwise the
// float32 product of its widened operands, as an fp16 product always is,
// and HalfGemmPath says so: at one thread the float32 Gemm, at more each
// block of C's rows (widenParts) a single-threaded float32 Gemm. The
// rounding products equal the stored-operand ones bitwise, also when an
// operand already holds half values, which the product reads as it is,
// with no rounded copy.
func TestGemmHalfPortablePath(t *testing.T) {
	was := SetBF16Kernel(false)
	defer SetBF16Kernel(was)
	require.Contains(t, HalfGemmPath(), "float32 "+BLASName())
	split := 0 // products split into row blocks
	for _, threads := range []int{1, 2, 3} {
		for _, h := range halfCases() {
			for _, f16 := range []bool{false, true} {
				narrow, widen, gemm, gemmRound := BF16FromF32, BF16ToF32, GemmBF16, GemmRoundBF16
				if f16 {
					narrow, widen, gemm, gemmRound = F16FromF32, F16ToF32, GemmF16, GemmRoundF16
				}
				ah, bh := convert(h.a, narrow), convert(h.b, narrow)
				aw, bw := widenAll(ah, widen), widenAll(bh, widen)
				want := append([]float32(nil), h.c...)
				var parts int
				withThreads(threads, func() { parts = widenParts(h.m) })
				if parts == 1 {
					withThreads(threads, func() {
						Gemm(h.ta, h.tb, h.m, h.n, h.k, h.alpha, aw, h.lda, bw, h.ldb, h.beta, want, h.ldc)
					})
				} else {
					split++
					withThreads(1, func() {
						for p := range parts {
							lo, hi := p*h.m/parts, (p+1)*h.m/parts
							off := lo * h.lda
							if h.ta {
								off = lo
							}
							Gemm(h.ta, h.tb, hi-lo, h.n, h.k, h.alpha, aw[off:], h.lda, bw, h.ldb, h.beta, want[lo*h.ldc:], h.ldc)
						}
					})
				}
				name := fmt.Sprintf("%s f16 %v threads %d", h.name, f16, threads)

				withThreads(threads, func() {
					c := append([]float32(nil), h.c...)
					gemm(h.ta, h.tb, h.m, h.n, h.k, h.alpha, ah, h.lda, bh, h.ldb, h.beta, c, h.ldc)
					requireSameBits(t, c, want, "stored "+name)
					c = append(c[:0], h.c...)
					gemmRound(h.ta, h.tb, h.m, h.n, h.k, h.alpha, h.a, h.lda, h.b, h.ldb, h.beta, c, h.ldc)
					requireSameBits(t, c, want, "rounded as read "+name)
					c = append(c[:0], h.c...)
					gemmRound(h.ta, h.tb, h.m, h.n, h.k, h.alpha, aw, h.lda, h.b, h.ldb, h.beta, c, h.ldc)
					requireSameBits(t, c, want, "A already half "+name)
					c = append(c[:0], h.c...)
					GemmRoundAHalfB(f16, h.ta, h.tb, h.m, h.n, h.k, h.alpha, h.a, h.lda, bh, h.ldb, h.beta, c, h.ldc)
					requireSameBits(t, c, want, "B a stored copy "+name)
					c = append(c[:0], h.c...)
					GemmHalfARoundB(f16, h.ta, h.tb, h.m, h.n, h.k, h.alpha, ah, h.lda, h.b, h.ldb, h.beta, c, h.ldc)
					requireSameBits(t, c, want, "A a stored copy "+name)
				})

				// the operand that holds half values is read in place; the
				// one that does not is rounded into a buffer
				got, buf := halfOperand{f: aw, f16: f16}.widen(h.ta, h.m, h.k, h.lda, true)
				require.Nil(t, buf, name)
				require.Same(t, &aw[0], &got[0], name)
				got, buf = halfOperand{f: h.a, f16: f16}.widen(h.ta, h.m, h.k, h.lda, true)
				require.NotNil(t, buf, name)
				rows, cols := h.m, h.k
				if h.ta {
					rows, cols = cols, rows
				}
				for r := 0; r < rows; r++ {
					requireSameBits(t, got[r*h.lda:r*h.lda+cols], aw[r*h.lda:r*h.lda+cols], "rounded "+name)
				}
				putWidenBuf(buf)
			}
		}
	}
	require.NotZero(t, split, "some products are split into row blocks")
	// k = 0: no operand is read, C is beta*C, also at a row count that
	// splits (an expert that got no tokens: its weight gradient's
	// product sums over none)
	for _, f16 := range []bool{false, true} {
		c := []float32{1, 2, 3, 4, 5, 6}
		GemmRoundAHalfB(f16, false, false, 2, 3, 0, 1, nil, 1, nil, 3, 0.5, c, 3)
		require.Equal(t, []float32{0.5, 1, 1.5, 2, 2.5, 3}, c)
		m := 4 * widenRows
		c, want := make([]float32, m*3), make([]float32, m*3)
		for i := range c {
			c[i], want[i] = float32(i), float32(i)/2
		}
		withThreads(2, func() { GemmHalfARoundB(f16, true, false, m, 3, 0, 1, nil, m, nil, 3, 0.5, c, 3) })
		require.Equal(t, want, c)
	}
}

// TestBF16KernelEnv: TINYACC_BF16_KERNEL=off, read at start, sends bf16
// products down the portable path (a test binary started with it reports
// that path); unset, a CPU with the kernel uses it.
func TestBF16KernelEnv(t *testing.T) {
	if os.Getenv("TINYACC_TEST_BF16_CHILD") == "1" {
		fmt.Println("path=" + HalfGemmPath())
		return
	}
	path := func(env string) string {
		cmd := exec.Command(os.Args[0], "-test.run=^TestBF16KernelEnv$")
		cmd.Env = append(os.Environ(), "TINYACC_TEST_BF16_CHILD=1", env)
		out, err := cmd.Output()
		require.NoError(t, err)
		_, p, ok := strings.Cut(string(out), "path=")
		require.True(t, ok, string(out))
		return strings.Split(p, "\n")[0]
	}
	want := "float32 " + BLASName()
	if bf16Native {
		want += " (avx512bf16 turned off)"
	}
	require.Equal(t, want, path(BF16KernelEnv+"=off"))
	unset := "float32 " + BLASName()
	if bf16Native {
		unset = "avx512bf16"
	}
	require.Equal(t, unset, path(BF16KernelEnv+"="))
}

// TestHalfOperandSerial: the portable path's serial products read an
// operand that already holds half values where it is, at its stride (a
// head's columns of q|k|v, rounded where they are made), and any other as
// a dense copy of its rounded numbers; the numbers in the gap between the
// rows (the other heads') are not looked at.
func TestHalfOperandSerial(t *testing.T) {
	rng := newRNG(17)
	const rows, cols, ld = 7, 5, 9
	for _, f16 := range []bool{false, true} {
		round := func(v float32) float32 { return BF16ToF32(BF16FromF32(v)) }
		if f16 {
			round = func(v float32) float32 { return F16ToF32(F16FromF32(v)) }
		}
		x := randSlice[float32](rng, (rows-1)*ld+cols, 1)
		for r := 0; r < rows; r++ {
			for c := 0; c < cols; c++ {
				x[r*ld+c] = round(x[r*ld+c]) // the region holds half values; the gap does not
			}
		}
		got, stride, release := halfOperand{f: x, f16: f16}.serial(rows, cols, ld)
		require.Equal(t, ld, stride, "f16 %v: exact operand's stride", f16)
		require.Same(t, &x[0], &got[0], "f16 %v: exact operand read where it is", f16)
		release()

		x[3*ld+2] += 1e-3 // one number of the region not a half value
		got, stride, release = halfOperand{f: x, f16: f16}.serial(rows, cols, ld)
		require.Equal(t, cols, stride, "f16 %v: rounded copy's stride", f16)
		require.NotSame(t, &x[0], &got[0], "f16 %v: inexact operand copied", f16)
		for r := 0; r < rows; r++ {
			for c := 0; c < cols; c++ {
				require.Equal(t, math.Float32bits(round(x[r*ld+c])), math.Float32bits(got[r*cols+c]), "f16 %v: [%d][%d]", f16, r, c)
			}
		}
		release()
	}
}
