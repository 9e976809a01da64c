package cpu

// RopeRotate turns rotary position embeddings: for every row r of x
// (stride ld), each head of the n columns from col (heads 2h wide,
// dimension d paired with d + h) is turned by the angles of row r%T of
// the tables cos and sin (T rows of h float64 numbers), into the same
// columns of y; sign -1 turns back (the backward):
//
//	y[d]   = x[d]·cos - x[d+h]·sin·sign
//	y[d+h] = x[d+h]·cos + x[d]·sin·sign
//
// in float64, each result rounded once to x's type. For float32 the C
// loop of the cgo build is ropeRotateGo operation for operation, so the
// bits are the same in every build.
func RopeRotate[F Float](x, y []F, rows, T, ld, col, n, h int, cos, sin []float64, sign float64) {
	if rows == 0 || n == 0 {
		return
	}
	checkLen("RopeRotate", (rows-1)*ld+col+n, len(x), len(y))
	checkLen("RopeRotate", T*h, len(cos), len(sin))
	if isF32[F]() {
		x32, y32 := as32(x), as32(y)
		ParallelFor(rows, 16, func(lo, hi int) { ropeRotate32(x32, y32, lo, hi, T, ld, col, n, h, cos, sin, sign) })
		return
	}
	ParallelFor(rows, 16, func(lo, hi int) { ropeRotateGo(x, y, lo, hi, T, ld, col, n, h, cos, sin, sign) })
}

// ropeRotateGo is RopeRotate's loop on rows [lo, hi).
func ropeRotateGo[F Float](x, y []F, lo, hi, T, ld, col, n, h int, cos, sin []float64, sign float64) {
	for r := lo; r < hi; r++ {
		c, s := cos[(r%T)*h:(r%T+1)*h], sin[(r%T)*h:(r%T+1)*h]
		for o := col; o < col+n; o += 2 * h {
			xa, xb := x[r*ld+o:r*ld+o+h], x[r*ld+o+h:r*ld+o+2*h]
			ya, yb := y[r*ld+o:r*ld+o+h], y[r*ld+o+h:r*ld+o+2*h]
			for d := range h {
				a, b, sn := float64(xa[d]), float64(xb[d]), sign*s[d]
				ya[d], yb[d] = F(a*c[d]-b*sn), F(b*c[d]+a*sn)
			}
		}
	}
}
