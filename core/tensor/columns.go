package tensor

import (
	"fmt"
	"slices"
)

// Columns returns columns [lo, hi) of the last dimension of x, copied; the
// gradient flows back into those columns. Layers that split a fused weight
// (c_attn's q, k and v, a rank's heads) are built from it and Concat.
func Columns(x *Tensor, lo, hi int) *Tensor {
	checkFloat("Columns", x)
	w := x.Dim(-1)
	if lo < 0 || hi > w || lo > hi {
		panic(fmt.Sprintf("tensor: Columns [%d:%d) of %s", lo, hi, x))
	}
	rows := x.Numel() / max(1, w)
	shape := append(clone(x.shape[:len(x.shape)-1]), hi-lo)
	out := like(x, shape...)
	copyCols(out, 0, x, lo, hi-lo, rows)
	record(out, "columns", func(_ *Backprop, g *Tensor) []*Tensor {
		gx := zerosLike(x, x.shape...)
		copyCols(gx, lo, g, 0, hi-lo, rows)
		return []*Tensor{gx}
	}, x)
	return out
}

// Concat joins tensors along their last dimension; all other dimensions
// must agree.
func Concat(xs ...*Tensor) *Tensor {
	checkFloat("Concat", xs...)
	lead := xs[0].shape[:len(xs[0].shape)-1]
	total := 0
	for _, x := range xs {
		if !slices.Equal(x.shape[:len(x.shape)-1], lead) {
			panic(fmt.Sprintf("tensor: Concat of %s and %s", xs[0], x))
		}
		total += x.Dim(-1)
	}
	rows := Numel(lead)
	out := like(xs[0], append(clone(lead), total)...)
	at := 0
	for _, x := range xs {
		copyCols(out, at, x, 0, x.Dim(-1), rows)
		at += x.Dim(-1)
	}
	record(out, "concat", func(_ *Backprop, g *Tensor) []*Tensor {
		gs := make([]*Tensor, len(xs))
		at := 0
		for i, x := range xs {
			if x.requiresGrad {
				gs[i] = like(x, x.shape...)
				copyCols(gs[i], 0, g, at, x.Dim(-1), rows)
			}
			at += x.Dim(-1)
		}
		return gs
	}, xs...)
	return out
}

// copyCols copies n columns of every row: dst[r, dlo+j] = src[r, slo+j].
func copyCols(dst *Tensor, dlo int, src *Tensor, slo, n, rows int) {
	dw, sw := dst.Dim(-1), src.Dim(-1)
	for r := 0; r < rows; r++ {
		if dst.dtype == Float32 {
			copy(dst.f32[r*dw+dlo:r*dw+dlo+n], src.f32[r*sw+slo:r*sw+slo+n])
		} else {
			copy(dst.f64[r*dw+dlo:r*dw+dlo+n], src.f64[r*sw+slo:r*sw+slo+n])
		}
	}
}

// AddColumns returns y with d added into its columns [lo, lo+w) of the
// last dimension (w = d's last dimension): a low-rank adapter's update of
// part of a fused output (a Llama's q and v inside q|k|v). The gradient of
// y is the output's, d's its columns.
func AddColumns(y, d *Tensor, lo int) *Tensor {
	checkFloat("AddColumns", y, d)
	w, wd := y.Dim(-1), d.Dim(-1)
	rows := y.Numel() / max(1, w)
	if lo < 0 || lo+wd > w || d.Numel() != rows*wd {
		panic(fmt.Sprintf("tensor: AddColumns of %s into columns [%d:%d) of %s", d, lo, lo+wd, y))
	}
	out := like(y, y.shape...)
	out.CopyFrom(y)
	for r := 0; r < rows; r++ {
		if y.dtype == Float32 {
			o, s := out.f32[r*w+lo:r*w+lo+wd], d.f32[r*wd:(r+1)*wd]
			for j := range o {
				o[j] += s[j]
			}
		} else {
			o, s := out.f64[r*w+lo:r*w+lo+wd], d.f64[r*wd:(r+1)*wd]
			for j := range o {
				o[j] += s[j]
			}
		}
	}
	record(out, "add_columns", func(_ *Backprop, g *Tensor) []*Tensor {
		var gy, gd *Tensor
		if y.requiresGrad {
			gy = g
		}
		if d.requiresGrad {
			gd = like(d, d.shape...)
			copyCols(gd, 0, g, lo, wd, rows)
		}
		return []*Tensor{gy, gd}
	}, y, d)
	return out
}
