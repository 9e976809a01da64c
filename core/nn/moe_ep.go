package nn

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// Dispatcher moves a MoE layer's tokens between the ranks of an
// expert-parallel group (plugins/ep). The group's Size ranks split the
// experts into equal consecutive runs: rank r holds experts
// [r·E/Size, (r+1)·E/Size).
type Dispatcher interface {
	Size() int
	Rank() int
	// Counts sends count[e], the rows this rank has for expert e (all E
	// of them), to the rank holding e, and returns what every rank has
	// for this rank's experts: recv[q·L+j] rows from rank q for local
	// expert j (L = E/Size).
	Counts(count []int) (recv []int, err error)
	// Exchange sends send[p] rows of x [S, C] (in rank order) to rank p
	// and returns the recv[q] rows rank q sent, in rank order: an
	// autograd op whose backward is the inverse exchange.
	Exchange(x *tensor.Tensor, send, recv []int) (*tensor.Tensor, error)

	// The naive form (forwardGather) when Gathers is true:
	Gathers() bool
	// GatherRows concatenates every rank's x [N, W] in rank order
	// ([Size·N, W]); backward sums the gradient over the ranks and keeps
	// this rank's block (a reduce-scatter).
	GatherRows(x *tensor.Tensor) (*tensor.Tensor, error)
	// ScatterSum sums y [Size·N, C] over the ranks and returns block Rank
	// ([N, C]); backward all-gathers the gradient.
	ScatterSum(y *tensor.Tensor) (*tensor.Tensor, error)
	// GatherInts concatenates every rank's v (equal lengths) in rank order.
	GatherInts(v []int) ([]int, error)
}

// forwardGather is the naive form of forwardEP: every rank gathers the
// tokens of its whole group (rows, routing weights and choices), runs its
// experts on the rows routed to them, each sender's tokens routed as that
// sender routed them (Route with its capacity), and the weighted outputs,
// a partial sum for every token of the group, are summed over the group,
// each rank keeping its own tokens'. It moves Size times the tokens of the
// all-to-all form and is checked against it.
func (m *MoE) forwardGather(h, w *tensor.Tensor, choice []int, p Pass) (*tensor.Tensor, error) {
	d := m.Dispatch
	E, P, k := m.Cfg.Experts, d.Size(), m.Cfg.TopK
	L := E / P
	N := h.Dim(0)
	all, err := d.GatherRows(h)
	if err != nil {
		return nil, fmt.Errorf("nn: MoE gather: %w", err)
	}
	W, err := d.GatherRows(tensor.View(w, N, k))
	if err != nil {
		return nil, fmt.Errorf("nn: MoE gather: %w", err)
	}
	ch, err := d.GatherInts(choice)
	if err != nil {
		return nil, fmt.Errorf("nn: MoE gather: %w", err)
	}
	rows, weight := make([][]int, L), make([][]int, L)
	for q := 0; q < P; q++ {
		rt := Route(ch[q*N*k:(q+1)*N*k], N, k, E, m.Cfg.Capacity(N))
		for j := 0; j < L; j++ {
			e := d.Rank()*L + j
			for i, r := range rt.Rows[e] {
				rows[j] = append(rows[j], q*N+r)
				weight[j] = append(weight[j], q*N*k+rt.Weight[e][i])
			}
		}
	}
	var parts []tensor.Routed
	for j := range rows {
		y, err := m.Experts[d.Rank()*L+j].Forward(tensor.GatherRows(all, rows[j]), p)
		if err != nil {
			return nil, err
		}
		parts = append(parts, tensor.Routed{Y: y, Rows: rows[j], Weight: weight[j]})
	}
	out, err := d.ScatterSum(tensor.CombineRows(P*N, W, parts))
	if err != nil {
		return nil, fmt.Errorf("nn: MoE combine: %w", err)
	}
	return out, nil
}

// forwardEP runs the experts of routing rt over the expert-parallel group:
//
//  1. dispatch: this rank's rows for each expert, in expert order, go to
//     the rank holding it (Exchange); the received rows are grouped by
//     sender, then by that sender's expert;
//  2. each local expert runs on all the rows it received, from every
//     sender at once, and its outputs go back to their places;
//  3. combine: the inverse exchange returns every row's output to the
//     rank that sent it, where it is weighted and added at its token, in
//     expert order, as in one process.
//
// Every rank calls both exchanges and each output feeds the next, whatever
// it routed (possibly nothing), so backward runs the same collectives in
// the same order everywhere.
func (m *MoE) forwardEP(h, w *tensor.Tensor, rt Routing, p Pass) (*tensor.Tensor, error) {
	d := m.Dispatch
	E, P := m.Cfg.Experts, d.Size()
	L := E / P
	N := h.Dim(0)
	count := make([]int, E)
	var rows, weight []int
	for e := range rt.Rows {
		count[e] = len(rt.Rows[e])
		rows = append(rows, rt.Rows[e]...)
		weight = append(weight, rt.Weight[e]...)
	}
	recv, err := d.Counts(count)
	if err != nil {
		return nil, fmt.Errorf("nn: MoE dispatch counts: %w", err)
	}
	send, got := make([]int, P), make([]int, P)
	for e, n := range count {
		send[e/L] += n
	}
	for i, n := range recv {
		got[i/L] += n
	}
	x, err := d.Exchange(tensor.GatherRows(h, rows), send, got)
	if err != nil {
		return nil, fmt.Errorf("nn: MoE dispatch: %w", err)
	}
	// Row indices of x for each local expert: from every sender q, the
	// run after q's rows for the experts before it.
	R := x.Dim(0)
	idx := make([][]int, L)
	at := 0
	for q := 0; q < P; q++ {
		for j := 0; j < L; j++ {
			for i := 0; i < recv[q*L+j]; i++ {
				idx[j] = append(idx[j], at)
				at++
			}
		}
	}
	// Each local expert runs on every row it received (on none if no
	// sender chose it: its gradient is then zero but final), and the
	// outputs go back to x's row order, each row scaled by one.
	var parts []tensor.Routed
	for j, ix := range idx {
		y, err := m.Experts[d.Rank()*L+j].Forward(tensor.GatherRows(x, ix), p)
		if err != nil {
			return nil, err
		}
		parts = append(parts, tensor.Routed{Y: y, Rows: ix, Weight: ix})
	}
	y := tensor.CombineRows(R, ones(x, R), parts)
	back, err := d.Exchange(y, got, send)
	if err != nil {
		return nil, fmt.Errorf("nn: MoE combine: %w", err)
	}
	return tensor.CombineRows(N, w, []tensor.Routed{{Y: back, Rows: rows, Weight: weight}}), nil
}

// ones is a constant [n] tensor of ones in x's dtype.
func ones(x *tensor.Tensor, n int) *tensor.Tensor {
	if x.DType() == tensor.Float32 {
		f := make([]float32, n)
		for i := range f {
			f[i] = 1
		}
		return tensor.FromF32(f, n)
	}
	v := make([]float64, n)
	for i := range v {
		v[i] = 1
	}
	return tensor.FromF64(v, n)
}
