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
	// N and Rank are the group the unit is sharded over and this rank's
	// place in it: the data-parallel group, or for a Held unit the ranks
	// holding the same parameters.
	N, Rank int
	// Held is set for the unit of a module's parameters that only some
	// ranks of the data-parallel group hold (an expert placed by expert
	// parallel): it follows the module's other unit and is sharded over
	// its holders, the replicas, instead of the data-parallel group.
	Held bool
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
	// expert placed by expert parallel, which differs from rank to rank)
	// when no group of their holders was given (NewLayoutHeld): they are
	// in no unit, and each holder keeps and updates them whole.
	Whole   []*tensor.Tensor
	unitOf  map[*tensor.Tensor]int
	rangeOf map[*tensor.Tensor]*Range
}

// NewLayout lays out m's parameters that take a gradient unit by unit
// (embed, each block, head) for a group of n ranks and this rank. Parameters keep their registration
// order inside a unit; each unit is padded at its end so it splits into n
// equal shards. Parameters only some ranks of the group hold are kept
// whole (Layout.Whole).
func NewLayout(m *nn.GPT, n, rank int) (*Layout, error) { return NewLayoutHeld(m, n, rank, 0, 0) }

// NewLayoutHeld is NewLayout where the parameters held along dp by some
// ranks only (an expert placed by expert parallel) are sharded over a
// group of hn of their holders, of which this rank is hrank: each
// module's held parameters form a unit of their own (Unit.Held) right
// after its other unit. hn = 0 keeps them whole (Layout.Whole).
func NewLayoutHeld(m *nn.GPT, n, rank, hn, hrank int) (*Layout, error) {
	if n < 1 || rank < 0 || rank >= n {
		return nil, fmt.Errorf("zero: layout for rank %d of a group of %d: the rank must be in [0, size)", rank, n)
	}
	if hn < 0 || (hn > 0 && (hrank < 0 || hrank >= hn)) {
		return nil, fmt.Errorf("zero: layout for rank %d of a group of %d holders: the rank must be in [0, size)", hrank, hn)
	}
	l := &Layout{N: n, Rank: rank, unitOf: map[*tensor.Tensor]int{}, rangeOf: map[*tensor.Tensor]*Range{}}
	for _, mod := range m.Modules() {
		u := &Unit{Module: mod, Name: mod.Name(), N: n, Rank: rank}
		u.Lookup = m.Embed != nil && mod == m.Embed.Module
		held := &Unit{Module: mod, Name: mod.Name() + ".held", N: hn, Rank: hrank, Held: true}
		for _, p := range mod.Params() {
			if !p.NeedsGrad() {
				// A frozen parameter (LoRA's base) has no gradient and no
				// optimizer state: it stays a whole tensor on every rank,
				// outside the flat buffers, and a module of only frozen
				// parameters is no unit.
				continue
			}
			into := u
			if p.Spec != nil && (p.Spec.Along[place.DP].Kind == place.Held || p.Spec.Along[place.CP].Kind == place.Held) {
				if hn == 0 {
					l.Whole = append(l.Whole, p)
					continue
				}
				into = held
			}
			if _, dup := l.unitOf[p]; dup {
				return nil, fmt.Errorf("zero: parameter %s belongs to two modules", p.Name)
			}
			if p.DType() != tensor.Float32 && p.DType() != tensor.Float64 {
				return nil, fmt.Errorf("zero: parameter %s is %s; sharding supports float32 and float64 parameters", p.Name, p.DType())
			}
			into.Ranges = append(into.Ranges, Range{Name: p.Name, Param: p, Offset: into.Numel, Numel: p.Numel(), Decay: len(p.Shape()) >= 2})
			into.Numel += p.Numel()
			l.unitOf[p] = -1 // numbered below
		}
		for _, v := range []*Unit{u, held} {
			if len(v.Ranges) == 0 {
				continue
			}
			v.Index = len(l.Units)
			for _, r := range v.Ranges {
				l.unitOf[r.Param] = v.Index
			}
			v.Size = (v.Numel + v.N - 1) / v.N * v.N
			v.Shard = v.Size / v.N
			l.Units = append(l.Units, v)
		}
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
func (l *Layout) Lo(u *Unit) int { return u.Rank * u.Shard }

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
