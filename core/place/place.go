// Package place says where the parts of a global tensor live.
//
// A model parameter is one global tensor (Hugging Face GPT-2 name, global
// shape). A rank holds a local tensor that is some part of it, decided by
// one Placement per mesh axis, in mesh order (pp outermost, then dp, cp, and
// tp innermost, as core/mesh lays ranks out):
//
//	Replicate  every rank along the axis holds the same elements
//	Shard      the rank holds Length indices of tensor dimension Dim,
//	           starting at Offset (uneven splits allowed); with Blocks > 1
//	           the dimension is that many equal blocks, each split alike
//	           (GPT-2's fused c_attn is [q | k | v] along its columns)
//	Partial    every rank holds a full-shaped addend: the value is the sum
//	           over the axis (a gradient not reduced yet)
//	Held       only the ranks listed hold it (a pipeline stage's blocks; the
//	           tied wte on the first and the last stage)
//	Flat       the rank holds elements [Offset, Offset+Length) of the local
//	           tensor flattened row-major (ZeRO's flat buffers); at most one
//	           axis is Flat, and it applies after every other axis
//
// Pieces answers "which parts of global tensor X does this rank hold";
// Owns says whether this rank is the one that counts them, so that a sum
// over ranks (a gradient norm, a gathered checkpoint tensor) sees every
// global element exactly once.
package place

import (
	"fmt"
	"slices"
	"strings"
)

// Axis is a mesh dimension, in mesh order.
type Axis int

const (
	PP Axis = iota
	DP
	CP
	TP
	NumAxes
)

var axisNames = [NumAxes]string{"pp", "dp", "cp", "tp"}

func (a Axis) String() string {
	if a >= 0 && a < NumAxes {
		return axisNames[a]
	}
	return fmt.Sprintf("axis(%d)", int(a))
}

// Kind is how a tensor is laid out along one mesh axis.
type Kind int

const (
	Replicate Kind = iota
	Shard
	Partial
	Held
	Flat
)

var kindNames = [...]string{"replicate", "shard", "partial", "held", "flat"}

func (k Kind) String() string {
	if k >= 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// Placement is the layout along one axis; the zero value is Replicate.
type Placement struct {
	Kind   Kind
	Dim    int   // Shard: the tensor dimension split
	Blocks int   // Shard: equal blocks of Dim split alike (0 or 1: one)
	Offset int   // Shard: first index held (inside each block); Flat: first element
	Length int   // Shard: indices held (inside each block); Flat: elements
	Ranks  []int // Held: the ranks along the axis that hold the tensor, in order
}

func (p Placement) String() string {
	switch p.Kind {
	case Shard:
		if p.Blocks > 1 {
			return fmt.Sprintf("shard(dim %d, %d blocks, [%d:%d))", p.Dim, p.Blocks, p.Offset, p.Offset+p.Length)
		}
		return fmt.Sprintf("shard(dim %d, [%d:%d))", p.Dim, p.Offset, p.Offset+p.Length)
	case Held:
		return fmt.Sprintf("held%v", p.Ranks)
	case Flat:
		return fmt.Sprintf("flat[%d:%d)", p.Offset, p.Offset+p.Length)
	}
	return p.Kind.String()
}

// Coord is a rank's position on the mesh: its index and the size of each
// axis. The zero value is not valid; Single is one process.
type Coord struct {
	Rank, Size [NumAxes]int
}

// Single is the coordinate of a run in one process.
var Single = Coord{Size: [NumAxes]int{1, 1, 1, 1}}

// Spec describes one global tensor and this rank's part of it.
type Spec struct {
	Name  string
	Shape []int // global shape
	Along [NumAxes]Placement
}

// NewSpec returns the spec of a tensor replicated on every axis.
func NewSpec(name string, shape []int) *Spec {
	return &Spec{Name: name, Shape: slices.Clone(shape)}
}

// Clone returns a deep copy (plugins derive a gradient's spec from a
// value's).
func (s *Spec) Clone() *Spec {
	c := *s
	c.Shape = slices.Clone(s.Shape)
	for a := range c.Along {
		c.Along[a].Ranks = slices.Clone(s.Along[a].Ranks)
	}
	return &c
}

func (s *Spec) String() string {
	var parts []string
	for a := Axis(0); a < NumAxes; a++ {
		if s.Along[a].Kind != Replicate {
			parts = append(parts, a.String()+" "+s.Along[a].String())
		}
	}
	if len(parts) == 0 {
		parts = []string{"replicated"}
	}
	return fmt.Sprintf("%s %v: %s", s.Name, s.Shape, strings.Join(parts, ", "))
}

// Numel is the number of elements of the global tensor.
func (s *Spec) Numel() int {
	n := 1
	for _, d := range s.Shape {
		n *= d
	}
	return n
}

// Holds reports whether the rank at c holds any part of the tensor.
func (s *Spec) Holds(c Coord) bool {
	for a := Axis(0); a < NumAxes; a++ {
		p := s.Along[a]
		if p.Kind == Held && !slices.Contains(p.Ranks, c.Rank[a]) {
			return false
		}
	}
	return true
}

// Owns reports whether the rank at c counts the elements it holds when
// a sum over all ranks must see each global element once: along a
// Replicate axis only index 0 counts, along a Held axis only the first
// listed rank; Shard and Flat parts are disjoint, so every holder counts.
// A Partial axis holds addends, not elements: it is an error to count it.
func (s *Spec) Owns(c Coord) (bool, error) {
	if !s.Holds(c) {
		return false, nil
	}
	for a := Axis(0); a < NumAxes; a++ {
		p := s.Along[a]
		switch p.Kind {
		case Replicate:
			if c.Rank[a] != 0 {
				return false, nil
			}
		case Held:
			if c.Rank[a] != p.Ranks[0] {
				return false, nil
			}
		case Partial:
			return false, fmt.Errorf("place: %s is a pending sum along %s; reduce it before counting its elements", s.Name, a)
		}
	}
	return true, nil
}

// LocalShape is the shape of the local tensor before any Flat axis: the
// global shape with each Shard's dimension cut to Blocks × Length.
func (s *Spec) LocalShape() []int {
	shape := slices.Clone(s.Shape)
	for _, p := range s.Along {
		if p.Kind == Shard {
			shape[p.Dim] = max(1, p.Blocks) * p.Length
		}
	}
	return shape
}

// Validate reports a placement that does not fit the global shape.
func (s *Spec) Validate() error {
	flat := 0
	sharded := map[int]bool{}
	for a := Axis(0); a < NumAxes; a++ {
		p := s.Along[a]
		switch p.Kind {
		case Shard:
			if sharded[p.Dim] {
				return fmt.Errorf("place: %s is sharded twice along dimension %d; one axis per dimension", s.Name, p.Dim)
			}
			sharded[p.Dim] = true
			blocks := max(1, p.Blocks)
			if p.Dim < 0 || p.Dim >= len(s.Shape) || s.Shape[p.Dim]%blocks != 0 {
				return fmt.Errorf("place: %s: %s along %s does not fit shape %v", s.Name, p, a, s.Shape)
			}
			if p.Offset < 0 || p.Length < 0 || p.Offset+p.Length > s.Shape[p.Dim]/blocks {
				return fmt.Errorf("place: %s: %s along %s is outside shape %v", s.Name, p, a, s.Shape)
			}
		case Held:
			if len(p.Ranks) == 0 {
				return fmt.Errorf("place: %s: held along %s by no rank", s.Name, a)
			}
		case Flat:
			flat++
			if p.Offset < 0 || p.Length < 0 {
				return fmt.Errorf("place: %s: %s along %s is a negative range", s.Name, p, a)
			}
		}
	}
	if flat > 1 {
		return fmt.Errorf("place: %s is flat-sharded along %d axes; at most one may be", s.Name, flat)
	}
	for _, p := range s.Along {
		if p.Kind == Flat {
			n := 1
			for _, d := range s.LocalShape() {
				n *= d
			}
			if p.Offset+p.Length > n {
				return fmt.Errorf("place: %s: %s is outside the %d local elements", s.Name, p, n)
			}
		}
	}
	return nil
}
