//go:build !cgo || purego

package cpu

// Without cgo the float32 fast paths are the Go loops of fastpath.go.

func geluFwd32(x, y []float32)                    { geluFwd32Go(x, y) }
func geluBwd32(x, dy, dx []float32)               { geluBwd32Go(x, dy, dx) }
func geluBwdBF16(x []uint16, dy, dx []float32)    { geluBwdBF16Go(x, dy, dx) }
func geluBwd32Set(x, dy, dx []float32)            { geluBwd32SetGo(x, dy, dx) }
func geluBwdBF16Set(x []uint16, dy, dx []float32) { geluBwdBF16SetGo(x, dy, dx) }
func softmaxPrefix32(att []float32, ld, width int, lens []int64, maxs, sums []float32) {
	softmaxPrefix32Go(att, ld, width, lens, maxs, sums)
}

func softmaxRows32(src, dst []float32, rows, n int, maxs, sums []float32) {
	softmaxRows32Go(src, dst, rows, n, maxs, sums)
}

func layerNormFwd32(x, w, b, y, mean, rstd []float32, cols int, eps float32) {
	layerNormFwdGo(x, w, b, y, mean, rstd, cols, eps)
}

func layerNormBwd32(dy, x, w, mean, rstd, dx, pw, pb []float32, cols int) {
	layerNormBwdGo(dy, x, w, mean, rstd, dx, pw, pb, cols, false)
}

func layerNormBwd32Set(dy, x, w, mean, rstd, dx, pw, pb []float32, cols int) {
	layerNormBwdGo(dy, x, w, mean, rstd, dx, pw, pb, cols, true)
}

func colSums32(dy, p []float32, cols int) { colSumsGo(dy, p, cols) }
func addBias32(y, b []float32, cols int)  { addBiasGo(y, b, cols) }
func add32(x, y, z []float32)             { addGo(x, y, z) }
func axpy32(a float32, x, y []float32)    { axpyGo(a, x, y) }

func bf16FromF32s(dst []uint16, src []float32) { bf16FromF32sGo(dst, src) }
func bf16ToF32s(dst []float32, src []uint16)   { bf16ToF32sGo(dst, src) }

func bf16FromF32sStream(dst []uint16, src []float32) { bf16FromF32sGo(dst, src) }
func roundBF16(x []float32)                          { roundBF16Go(x) }

func expMinus32(row []float32, lse float32) { expMinus32Go(row, lse) }

func lseBackward32(p, dp []float32, delta float32) { lseBackwardGo(p, dp, delta) }

func lseRows32(lse, maxs, sums []float32) { lseRowsGo(lse, maxs, sums) }

func expMinusRows32(p []float32, ld int, lens, ends []int64, lse []float32) {
	expMinusRowsGo(p, ld, lens, ends, lse)
}

func lseBackwardRows32(p, dp []float32, ld int, lens, ends []int64, delta []float32) {
	lseBackwardRowsGo(p, dp, ld, lens, ends, delta)
}

func attnDelta32(d AttnDims, dout, out, delta []float32, lo, hi int) {
	attentionDeltaGo(d, dout, out, delta, lo, hi)
}

func adamW32(p, g, m, v []float32, gscale, decay, b1, b2, ob1, ob2, step, bc2Sqrt, eps float32) {
	adamWGo(p, g, m, v, gscale, decay, b1, b2, ob1, ob2, step, bc2Sqrt, eps)
}

func siluMulFwd32(x, y []float32, rows, n int)      { siluMulFwd32Go(x, y, rows, n) }
func siluMulBwd32(x, dy, dx []float32, rows, n int) { siluMulBwd32Go(x, dy, dx, rows, n) }
func rmsNormFwd32(x, w, y, rstd []float32, cols int, eps float32) {
	rmsNormFwd32Go(x, w, y, rstd, cols, eps)
}
func rmsNormBwd32(dy, x, w, rstd, dx, pw []float32, cols int) {
	rmsNormBwd32Go(dy, x, w, rstd, dx, pw, cols)
}
func ropeRotate32(x, y []float32, lo, hi, T, ld, col, n, h int, cos, sin []float64, sign float64) {
	ropeRotateGo(x, y, lo, hi, T, ld, col, n, h, cos, sin, sign)
}
