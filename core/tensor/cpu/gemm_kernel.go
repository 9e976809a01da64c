package cpu

import "sync"

// The pure-Go matrix product. It is the whole Gemm when no BLAS library is
// linked, so it is written for speed within what portable Go allows: both
// operands are packed into contiguous panels (which also absorbs the
// transposes, strides and alpha), and a register-blocked micro-kernel
// computes a goMR x goNR tile of C per pass over a panel.
const (
	goMR = 2    // rows of C per micro-kernel tile
	goNR = 4    // columns of C per micro-kernel tile
	goKC = 256  // depth of one packed panel: a goKC x goNR strip of B stays in L1
	goMC = 64   // rows of A packed per task: goMC x goKC of A stays in L2
	goNC = 1024 // columns of B packed at once (goKC x goNC of B in L2)
)

// bufPools recycle packing buffers per element size, so steady-state
// training does not allocate in Gemm.
var bufPools [2]sync.Pool

func poolIndex[T Float]() int {
	if isF32[T]() {
		return 0
	}
	return 1
}

// getBuf returns a scratch slice of length n with unspecified contents.
func getBuf[T Float](n int) *[]T {
	if v, ok := bufPools[poolIndex[T]()].Get().(*[]T); ok && cap(*v) >= n {
		*v = (*v)[:n]
		return v
	}
	s := make([]T, n)
	return &s
}

func putBuf[T Float](b *[]T) { bufPools[poolIndex[T]()].Put(b) }

// gemmGo computes C = alpha*op(A)*op(B) + beta*C; arguments as for Gemm,
// already checked.
func gemmGo[T Float](transA, transB bool, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	scaleC(m, n, beta, c, ldc)
	if k == 0 || alpha == 0 {
		return
	}
	bufB := getBuf[T](goKC * roundUp(min(n, goNC), goNR))
	defer putBuf(bufB)
	for jc := 0; jc < n; jc += goNC {
		nb := min(goNC, n-jc)
		for pc := 0; pc < k; pc += goKC {
			kb := min(goKC, k-pc)
			bp := (*bufB)[:kb*roundUp(nb, goNR)]
			packB(bp, b, ldb, transB, pc, jc, kb, nb)
			blocks := (m + goMC - 1) / goMC
			ParallelFor(blocks, 1, func(lo, hi int) {
				bufA := getBuf[T](goMC * kb)
				for blk := lo; blk < hi; blk++ {
					ic := blk * goMC
					mb := min(goMC, m-ic)
					ap := (*bufA)[:roundUp(mb, goMR)*kb]
					packA(ap, a, lda, transA, alpha, ic, pc, mb, kb)
					macroKernel(mb, nb, kb, ap, bp, c[ic*ldc+jc:], ldc)
				}
				putBuf(bufA)
			})
		}
	}
}

func roundUp(x, to int) int { return (x + to - 1) / to * to }

// packA copies the mb x kb block of alpha*op(A) starting at (ic, pc) into
// row panels of goMR rows: panel p holds, for each depth index, its goMR
// row values next to each other. Rows past mb are zero so edge tiles need
// no special case in the inner loop.
func packA[T Float](dst, a []T, lda int, trans bool, alpha T, ic, pc, mb, kb int) {
	for p0 := 0; p0 < mb; p0 += goMR {
		panel := dst[p0*kb : (p0+goMR)*kb]
		for r := 0; r < goMR; r++ {
			i := ic + p0 + r
			if p0+r >= mb {
				for q := 0; q < kb; q++ {
					panel[q*goMR+r] = 0
				}
				continue
			}
			if trans { // op(A)[i][q] = A[q][i]
				for q := 0; q < kb; q++ {
					panel[q*goMR+r] = alpha * a[(pc+q)*lda+i]
				}
			} else {
				row := a[i*lda+pc : i*lda+pc+kb]
				for q, v := range row {
					panel[q*goMR+r] = alpha * v
				}
			}
		}
	}
}

// packB copies the kb x nb block of op(B) starting at (pc, jc) into column
// panels of goNR columns, zero-padded like packA.
func packB[T Float](dst, b []T, ldb int, trans bool, pc, jc, kb, nb int) {
	for j0 := 0; j0 < nb; j0 += goNR {
		panel := dst[j0*kb : (j0+goNR)*kb]
		w := min(goNR, nb-j0)
		for q := 0; q < kb; q++ {
			out := panel[q*goNR : q*goNR+goNR]
			if trans { // op(B)[q][j] = B[j][q]
				for r := 0; r < w; r++ {
					out[r] = b[(jc+j0+r)*ldb+pc+q]
				}
			} else {
				copy(out[:w], b[(pc+q)*ldb+jc+j0:])
			}
			for r := w; r < goNR; r++ {
				out[r] = 0
			}
		}
	}
}

// macroKernel multiplies a packed mb x kb block of A by a packed kb x nb
// block of B and adds the result to C.
func macroKernel[T Float](mb, nb, kb int, ap, bp, c []T, ldc int) {
	var tile [goMR * goNR]T
	for j0 := 0; j0 < nb; j0 += goNR {
		bpan := bp[j0*kb : (j0+goNR)*kb]
		w := min(goNR, nb-j0)
		for i0 := 0; i0 < mb; i0 += goMR {
			apan := ap[i0*kb : (i0+goMR)*kb]
			h := min(goMR, mb-i0)
			micro2x4(apan, bpan, &tile)
			for r := 0; r < h; r++ {
				crow := c[(i0+r)*ldc+j0 : (i0+r)*ldc+j0+w]
				for s := range crow {
					crow[s] += tile[r*goNR+s]
				}
			}
		}
	}
}

// micro2x4 computes the 2x4 tile ap^T * bp over a packed panel pair. The
// tile is this small because the Go compiler keeps at most 15 floats in
// registers: 8 sums, 4 values of B and 2 of A fit, a 4x4 tile would spill
// to the stack on every step and run at a third of the speed.
func micro2x4[T Float](ap, bp []T, tile *[goMR * goNR]T) {
	var c00, c01, c02, c03, c10, c11, c12, c13 T
	for len(ap) >= 2 && len(bp) >= 4 {
		b0, b1, b2, b3 := bp[0], bp[1], bp[2], bp[3]
		a0 := ap[0]
		c00 += a0 * b0
		c01 += a0 * b1
		c02 += a0 * b2
		c03 += a0 * b3
		a1 := ap[1]
		c10 += a1 * b0
		c11 += a1 * b1
		c12 += a1 * b2
		c13 += a1 * b3
		ap, bp = ap[2:], bp[4:]
	}
	*tile = [goMR * goNR]T{c00, c01, c02, c03, c10, c11, c12, c13}
}
