package zero

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/tensor"
)

// Range is one parameter's place in its unit's flat buffer. Keeping the
// name and offset is what lets a flat shard be mapped back to the global
// tensors (checkpoints, the equivalence check) and what decides weight
// decay per shard view exactly as the unsharded optimizer would.
type Range struct {
	Name   string
	Param  *tensor.Tensor
	Offset int  // first element in the unit's flat buffer
	Numel  int  // elements of the parameter
	Decay  bool // weight decay applies: the tensor has two or more dims
}

// Piece is the part of a parameter that falls inside one rank's shard.
type Piece struct {
	Range  *Range
	Lo, Hi int // elements [Lo, Hi) of the flattened parameter
	At     int // where they start inside the shard
}

// ViewName names the optimizer view of the piece, e.g.
// "h.0.attn.c_attn.weight[0:1536]".
func (p Piece) ViewName() string { return fmt.Sprintf("%s[%d:%d]", p.Range.Name, p.Lo, p.Hi) }

// Unit is a set of parameters that are laid out, reduced, gathered and
// released together: one module of the model.
type Unit struct {
	Index  int
	Name   string // "embed", "h.3", "head"
	Module *nn.Module
	Ranges []Range
	Numel  int // parameter elements, without padding
	Size   int // Numel padded up to a multiple of the group size
	Shard  int // Size / group size: the elements each rank owns
	// Uses lists the other units whose parameters this unit's forward and
	// backward read: the head reads the embed unit's tied wte.
	Uses []int
	// Lookup is set for the embed unit: its backward reads none of its
	// parameters (a lookup's gradient is the output's gradient scattered
	// into the table's rows, a position table's the rows' sum), so stage 3
	// gathers it for its forward only.
	Lookup bool
}

// Layout places every parameter of the model in per-unit flat buffers and
// says which contiguous shard of each one a rank owns.
type Layout struct {
	N, Rank int
	Units   []*Unit
	// Whole are the parameters held by only some ranks of the group (an
	// expert placed by expert parallel, which differs from rank to rank):
	// they are in no unit, and each holder keeps and updates them whole.
	Whole   []*tensor.Tensor
	unitOf  map[*tensor.Tensor]int
	rangeOf map[*tensor.Tensor]*Range
}

// NewLayout lays out m's parameters that take a gradient unit by unit
// (embed, each block, head) for a group of n ranks and this rank. Parameters keep their registration
// order inside a unit; each unit is padded at its end so it splits into n
// equal shards.
func NewLayout(m *nn.GPT, n, rank int) (*Layout, error) {
	if n < 1 || rank < 0 || rank >= n {
		return nil, fmt.Errorf("zero: layout for rank %d of a group of %d: the rank must be in [0, size)", rank, n)
	}
	l := &Layout{N: n, Rank: rank, unitOf: map[*tensor.Tensor]int{}, rangeOf: map[*tensor.Tensor]*Range{}}
	for _, mod := range m.Modules() {
		i := len(l.Units)
		u := &Unit{Index: i, Module: mod, Name: mod.Name()}
		u.Lookup = m.Embed != nil && mod == m.Embed.Module
		for _, p := range mod.Params() {
			if !p.NeedsGrad() {
				// A frozen parameter (LoRA's base) has no gradient and no
				// optimizer state: it stays a whole tensor on every rank,
				// outside the flat buffers, and a module of only frozen
				// parameters is no unit.
				continue
			}
			if p.Spec != nil && (p.Spec.Along[place.DP].Kind == place.Held || p.Spec.Along[place.CP].Kind == place.Held) {
				l.Whole = append(l.Whole, p)
				continue
			}
			if _, dup := l.unitOf[p]; dup {
				return nil, fmt.Errorf("zero: parameter %s belongs to two modules", p.Name)
			}
			if p.DType() != tensor.Float32 && p.DType() != tensor.Float64 {
				return nil, fmt.Errorf("zero: parameter %s is %s; sharding supports float32 and float64 parameters", p.Name, p.DType())
			}
			u.Ranges = append(u.Ranges, Range{Name: p.Name, Param: p, Offset: u.Numel, Numel: p.Numel(), Decay: len(p.Shape()) >= 2})
			u.Numel += p.Numel()
			l.unitOf[p] = i
		}
		if len(u.Ranges) == 0 {
			continue
		}
		u.Size = (u.Numel + n - 1) / n * n
		u.Shard = u.Size / n
		l.Units = append(l.Units, u)
	}
	for _, u := range l.Units {
		for i := range u.Ranges {
			l.rangeOf[u.Ranges[i].Param] = &u.Ranges[i]
		}
	}
	// The head computes logits against wte, which the embed unit holds
	// when this model has both (a pipeline's last stage has its own).
	if m.Head != nil && len(l.Units) > 0 {
		head := l.Units[len(l.Units)-1]
		if e, ok := l.unitOf[m.Head.Wte]; ok && e != head.Index && head.Module == m.Head.Module {
			head.Uses = append(head.Uses, e)
		}
	}
	return l, nil
}

// Range returns where p lies in its unit's flat buffer, or nil.
func (l *Layout) Range(p *tensor.Tensor) *Range { return l.rangeOf[p] }

// UnitOf returns the index of the unit holding p, or -1.
func (l *Layout) UnitOf(p *tensor.Tensor) int {
	if i, ok := l.unitOf[p]; ok {
		return i
	}
	return -1
}

// Lo is the first flat element of u that this rank owns.
func (l *Layout) Lo(u *Unit) int { return l.Rank * u.Shard }

// Pieces returns the intersections of u's parameters with this rank's
// shard [Lo, Lo+Shard), in flat order. Padding belongs to no piece.
func (l *Layout) Pieces(u *Unit) []Piece {
	lo, hi := l.Lo(u), l.Lo(u)+u.Shard
	var out []Piece
	for i := range u.Ranges {
		r := &u.Ranges[i]
		a, b := max(lo, r.Offset), min(hi, r.Offset+r.Numel)
		if a < b {
			out = append(out, Piece{Range: r, Lo: a - r.Offset, Hi: b - r.Offset, At: a - lo})
		}
	}
	return out
}

// PaddedSize is the elements of every unit's flat buffer, padding included.
func (l *Layout) PaddedSize() int {
	s := 0
	for _, u := range l.Units {
		s += u.Size
	}
	return s
}
