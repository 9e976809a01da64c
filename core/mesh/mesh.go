// Package mesh lays the ranks of a job out on tinyacc's 4D grid and builds
// the process groups of each dimension.
//
// Tensor parallel is innermost, so a TP group is made of neighbouring ranks
// (the ones that talk most, at every layer, share the fastest links); then
// context parallel, then data parallel, and pipeline parallel outermost
// (stages exchange only activations at their boundaries):
//
//	rank = ((pp·DP + dp)·CP + cp)·TP + tp
package mesh

import (
	"fmt"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/place"
)

// Coord is a rank's position on the grid.
type Coord struct {
	TP, CP, DP, PP int
}

// Shape is the size of each dimension.
type Shape struct {
	TP, CP, DP, PP int
}

// World is the number of ranks the shape needs.
func (s Shape) World() int { return s.TP * s.CP * s.DP * s.PP }

// Rank is the global rank at c.
func (s Shape) Rank(c Coord) int {
	return ((c.PP*s.DP+c.DP)*s.CP+c.CP)*s.TP + c.TP
}

// Coord is the position of global rank r.
func (s Shape) Coord(r int) Coord {
	var c Coord
	c.TP, r = r%s.TP, r/s.TP
	c.CP, r = r%s.CP, r/s.CP
	c.DP, r = r%s.DP, r/s.DP
	c.PP = r
	return c
}

// Mesh is one rank's view of the grid: its coordinates and the groups of the
// dimensions it belongs to.
type Mesh struct {
	shape Shape
	world comm.Group
	coord Coord

	tp, cp, dp, pp, dpcp comm.Group
}

// New builds the mesh over world. Every rank of world must call it with the
// same sizes: it creates every group of every dimension, in the same order on
// all ranks, as comm.Group.NewGroup requires.
func New(world comm.Group, tp, cp, dp, pp int) (*Mesh, error) {
	s := Shape{TP: tp, CP: cp, DP: dp, PP: pp}
	if tp < 1 || cp < 1 || dp < 1 || pp < 1 {
		return nil, fmt.Errorf("mesh: every dimension needs at least 1 rank, got tp %d, cp %d, dp %d, pp %d", tp, cp, dp, pp)
	}
	if n := world.Size(); n != s.World() {
		return nil, fmt.Errorf("mesh: world size %d != tp %d × cp %d × dp %d × pp %d = %d", n, tp, cp, dp, pp, s.World())
	}
	m := &Mesh{shape: s, world: world, coord: s.Coord(world.Rank())}
	var err error
	// Each dimension: one group per combination of the other coordinates.
	if m.tp, err = m.build("tp", func(c Coord, i int) Coord { c.TP = i; return c }, tp); err != nil {
		return nil, err
	}
	if m.cp, err = m.build("cp", func(c Coord, i int) Coord { c.CP = i; return c }, cp); err != nil {
		return nil, err
	}
	if m.dp, err = m.build("dp", func(c Coord, i int) Coord { c.DP = i; return c }, dp); err != nil {
		return nil, err
	}
	if m.pp, err = m.build("pp", func(c Coord, i int) Coord { c.PP = i; return c }, pp); err != nil {
		return nil, err
	}
	// DP×CP: gradients are averaged over both (CP ranks hold different
	// tokens of the same sequence); cp varies fastest inside the group.
	if m.dpcp, err = m.build("dp_cp", func(c Coord, i int) Coord { c.CP, c.DP = i%cp, i/cp; return c }, dp*cp); err != nil {
		return nil, err
	}
	return m, nil
}

// build creates, for every rank of the world taken as a group representative
// (the one whose coordinate along the dimension is 0), the group obtained by
// varying that coordinate with set; it keeps the group this rank is in.
func (m *Mesh) build(name string, set func(c Coord, i int) Coord, size int) (comm.Group, error) {
	var mine comm.Group
	for r := 0; r < m.shape.World(); r++ {
		base := m.shape.Coord(r)
		if set(base, 0) != base {
			continue // not a representative: its group is made once, from the representative
		}
		ranks := make([]int, size)
		for i := range ranks {
			ranks[i] = m.shape.Rank(set(base, i))
		}
		g, err := m.world.NewNamedGroup(name, ranks)
		if err != nil {
			return nil, fmt.Errorf("mesh: %s group %v: %w", name, ranks, err)
		}
		if g != nil {
			mine = g
		}
	}
	return mine, nil
}

// Shape is the size of each dimension.
func (m *Mesh) Shape() Shape { return m.shape }

// Coord is this rank's position.
func (m *Mesh) Coord() Coord { return m.coord }

// Place is this rank's coordinate in the terms parameter placements use.
func (m *Mesh) Place() place.Coord {
	return place.Coord{
		Rank: [place.NumAxes]int{place.PP: m.coord.PP, place.DP: m.coord.DP, place.CP: m.coord.CP, place.TP: m.coord.TP},
		Size: [place.NumAxes]int{place.PP: m.shape.PP, place.DP: m.shape.DP, place.CP: m.shape.CP, place.TP: m.shape.TP},
	}
}

// Rank is this rank's global rank.
func (m *Mesh) Rank() int { return m.world.Rank() }

func (m *Mesh) TPRank() int { return m.coord.TP }
func (m *Mesh) CPRank() int { return m.coord.CP }
func (m *Mesh) DPRank() int { return m.coord.DP }
func (m *Mesh) PPRank() int { return m.coord.PP }

// WorldGroup is the group of every rank.
func (m *Mesh) WorldGroup() comm.Group { return m.world }

// TP is this rank's tensor-parallel group (same cp, dp, pp).
func (m *Mesh) TP() comm.Group { return m.tp }

// CP is this rank's context-parallel group (same tp, dp, pp).
func (m *Mesh) CP() comm.Group { return m.cp }

// DP is this rank's data-parallel group (same tp, cp, pp).
func (m *Mesh) DP() comm.Group { return m.dp }

// PP is this rank's pipeline group (same tp, cp, dp): stage i is PP rank i.
func (m *Mesh) PP() comm.Group { return m.pp }

// DPCP is the data-parallel × context-parallel group (same tp, pp), over
// which gradients are averaged when context parallelism is on.
func (m *Mesh) DPCP() comm.Group { return m.dpcp }

// Close releases the groups (not the world).
func (m *Mesh) Close() error {
	for _, g := range []comm.Group{m.tp, m.cp, m.dp, m.pp, m.dpcp} {
		if g != nil {
			if err := g.Close(); err != nil {
				return err
			}
		}
	}
	return nil
}
