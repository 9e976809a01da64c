package place

import "fmt"

// Box is a rectangular part of a tensor: Len[d] indices of dimension d
// from Start[d].
type Box struct {
	Start, Len []int
}

// Numel is the number of elements in the box.
func (b Box) Numel() int {
	n := 1
	for _, l := range b.Len {
		n *= l
	}
	return n
}

func (b Box) String() string {
	s := "["
	for d := range b.Start {
		if d > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%d:%d", b.Start[d], b.Start[d]+b.Len[d])
	}
	return s + "]"
}

// Piece is one box of the global tensor that this rank holds, and where it
// sits in the local tensor (Local, same lengths). A Flat axis narrows the
// pieces further to a range of local elements; Runs applies it.
type Piece struct {
	Global, Local Box
}

// segment maps Len local indices from Local to global indices from Global
// along one dimension.
type segment struct{ local, global, n int }

// segments lists, per dimension, how local indices map to global ones.
func (s *Spec) segments() [][]segment {
	segs := make([][]segment, len(s.Shape))
	for d, n := range s.Shape {
		segs[d] = []segment{{0, 0, n}}
	}
	for _, p := range s.Along {
		if p.Kind != Shard {
			continue
		}
		blocks := max(1, p.Blocks)
		size := s.Shape[p.Dim] / blocks
		var out []segment
		for b := 0; b < blocks; b++ {
			out = append(out, segment{local: b * p.Length, global: b*size + p.Offset, n: p.Length})
		}
		segs[p.Dim] = out
	}
	return segs
}

// Pieces lists the boxes of the global tensor this rank holds (before any
// Flat axis narrows them), in local row-major order of their first
// element; none when the rank does not hold the tensor.
func (s *Spec) Pieces(c Coord) []Piece {
	if !s.Holds(c) {
		return nil
	}
	segs := s.segments()
	var out []Piece
	idx := make([]int, len(segs))
	for {
		p := Piece{Global: Box{Start: make([]int, len(segs)), Len: make([]int, len(segs))},
			Local: Box{Start: make([]int, len(segs)), Len: make([]int, len(segs))}}
		for d, i := range idx {
			sg := segs[d][i]
			p.Global.Start[d], p.Local.Start[d] = sg.global, sg.local
			p.Global.Len[d], p.Local.Len[d] = sg.n, sg.n
		}
		out = append(out, p)
		// Next combination, last dimension fastest.
		d := len(idx) - 1
		for d >= 0 {
			idx[d]++
			if idx[d] < len(segs[d]) {
				break
			}
			idx[d] = 0
			d--
		}
		if d < 0 {
			return out
		}
	}
}

// flatRange is the part of the local tensor a Flat axis keeps: [lo, hi),
// or the whole tensor.
func (s *Spec) flatRange() (lo, hi int, flat bool) {
	for _, p := range s.Along {
		if p.Kind == Flat {
			return p.Offset, p.Offset + p.Length, true
		}
	}
	n := 1
	for _, d := range s.LocalShape() {
		n *= d
	}
	return 0, n, false
}

// HeldElements is the number of elements this rank's data holds: the
// local tensor, or its Flat range.
func (s *Spec) HeldElements(c Coord) int {
	if !s.Holds(c) {
		return 0
	}
	lo, hi, _ := s.flatRange()
	return hi - lo
}

// Runs calls fn for every contiguous run of elements this rank holds:
// n elements at flat index global of the global tensor are at index local
// of the rank's data (the local tensor, or for a Flat axis the buffer that
// starts at the range's first element). Runs come in local order.
func (s *Spec) Runs(c Coord, fn func(global, local, n int)) {
	if !s.Holds(c) {
		return
	}
	lo, hi, _ := s.flatRange()
	local := s.LocalShape()
	nd := len(s.Shape)
	if nd == 0 {
		if lo < hi {
			fn(0, 0, 1)
		}
		return
	}
	// Row-major strides of the global and local tensors.
	gs, ls := make([]int, nd), make([]int, nd)
	gs[nd-1], ls[nd-1] = 1, 1
	for d := nd - 2; d >= 0; d-- {
		gs[d], ls[d] = gs[d+1]*s.Shape[d+1], ls[d+1]*local[d+1]
	}
	for _, p := range s.Pieces(c) {
		// Walk the box row by row along the last dimension.
		rows := 1
		for d := 0; d < nd-1; d++ {
			rows *= p.Global.Len[d]
		}
		w := p.Global.Len[nd-1]
		idx := make([]int, nd-1)
		for r := 0; r < rows; r++ {
			g := p.Global.Start[nd-1]
			l := p.Local.Start[nd-1]
			for d := 0; d < nd-1; d++ {
				g += (p.Global.Start[d] + idx[d]) * gs[d]
				l += (p.Local.Start[d] + idx[d]) * ls[d]
			}
			// Clip the run to the Flat range.
			a, b := max(l, lo), min(l+w, hi)
			if a < b {
				fn(g+a-l, a-lo, b-a)
			}
			for d := nd - 2; d >= 0; d-- {
				idx[d]++
				if idx[d] < p.Global.Len[d] {
					break
				}
				idx[d] = 0
			}
		}
	}
}

// Scatter copies this rank's elements out of a global tensor: data[local]
// = global[...] for every run. It is how a checkpoint is loaded into any
// layout.
func Scatter[T any](s *Spec, c Coord, global, data []T) {
	s.Runs(c, func(g, l, n int) { copy(data[l:l+n], global[g:g+n]) })
}

// Gather writes this rank's elements into a global tensor: the inverse of
// Scatter. Ranks that own their elements (Owns) gathering into zeroed
// buffers and summing over ranks rebuild the global tensor exactly.
func Gather[T any](s *Spec, c Coord, data, global []T) {
	s.Runs(c, func(g, l, n int) { copy(global[g:g+n], data[l:l+n]) })
}
