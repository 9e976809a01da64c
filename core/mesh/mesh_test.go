package mesh

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/tensor"
)

func TestRankFormula(t *testing.T) {
	s := Shape{TP: 2, CP: 3, DP: 2, PP: 2}
	seen := map[int]bool{}
	for pp := 0; pp < 2; pp++ {
		for dp := 0; dp < 2; dp++ {
			for cp := 0; cp < 3; cp++ {
				for tp := 0; tp < 2; tp++ {
					want := ((pp*2+dp)*3+cp)*2 + tp // written out independently
					c := Coord{TP: tp, CP: cp, DP: dp, PP: pp}
					assert.Equal(t, want, s.Rank(c))
					assert.Equal(t, c, s.Coord(want))
					seen[want] = true
				}
			}
		}
	}
	assert.Len(t, seen, 24)
}

func TestWorldSizeMismatch(t *testing.T) {
	err := comm.RunLocal(6, comm.Options{}, func(g comm.Group) error {
		_, err := New(g, 2, 1, 2, 2)
		if err == nil || err.Error() != "mesh: world size 6 != tp 2 × cp 1 × dp 2 × pp 2 = 8" {
			return fmt.Errorf("got %v", err)
		}
		_, err = New(g, 0, 1, 6, 1)
		if err == nil || err.Error() != "mesh: every dimension needs at least 1 rank, got tp 0, cp 1, dp 6, pp 1" {
			return fmt.Errorf("got %v", err)
		}
		return nil
	})
	require.NoError(t, err)
}

// members lists the world ranks of g by all-gathering each member's rank,
// i.e. through real communication inside the group.
func members(g comm.Group, worldRank int) ([]int, error) {
	in := tensor.FromI32([]int32{int32(worldRank)}, 1)
	out := tensor.Default.New(tensor.Comm, tensor.Int32, g.Size())
	if err := g.AllGather(in, out); err != nil {
		return nil, err
	}
	r := make([]int, g.Size())
	for i, v := range out.I32() {
		r[i] = int(v)
	}
	return r, nil
}

func TestGroupsForSeveralShapes(t *testing.T) {
	shapes := []Shape{{2, 1, 2, 2}, {1, 2, 3, 1}, {2, 2, 1, 1}, {1, 1, 1, 5}, {3, 1, 1, 1}, {1, 2, 2, 2}}
	for _, s := range shapes {
		t.Run(fmt.Sprintf("tp%d_cp%d_dp%d_pp%d", s.TP, s.CP, s.DP, s.PP), func(t *testing.T) {
			err := comm.RunLocal(s.World(), comm.Options{}, func(g comm.Group) error {
				m, err := New(g, s.TP, s.CP, s.DP, s.PP)
				if err != nil {
					return err
				}
				me := g.Rank()
				c := m.Coord()
				// Expected members, enumerated by brute force over all ranks.
				want := map[string][]int{}
				for r := 0; r < s.World(); r++ {
					o := s.Coord(r)
					if o.CP == c.CP && o.DP == c.DP && o.PP == c.PP {
						want["tp"] = append(want["tp"], r)
					}
					if o.TP == c.TP && o.DP == c.DP && o.PP == c.PP {
						want["cp"] = append(want["cp"], r)
					}
					if o.TP == c.TP && o.CP == c.CP && o.PP == c.PP {
						want["dp"] = append(want["dp"], r)
					}
					if o.TP == c.TP && o.CP == c.CP && o.DP == c.DP {
						want["pp"] = append(want["pp"], r)
					}
					if o.TP == c.TP && o.PP == c.PP {
						want["dp_cp"] = append(want["dp_cp"], r)
					}
				}
				groups := map[string]comm.Group{"tp": m.TP(), "cp": m.CP(), "dp": m.DP(), "pp": m.PP(), "dp_cp": m.DPCP()}
				ranks := map[string]int{"tp": c.TP, "cp": c.CP, "dp": c.DP, "pp": c.PP, "dp_cp": c.DP*s.CP + c.CP}
				for _, name := range []string{"tp", "cp", "dp", "pp", "dp_cp"} {
					grp := groups[name]
					got, err := members(grp, me)
					if err != nil {
						return err
					}
					if fmt.Sprint(got) != fmt.Sprint(want[name]) {
						return fmt.Errorf("rank %d %s group %v, want %v", me, name, got, want[name])
					}
					if grp.Rank() != ranks[name] || grp.Name() != name {
						return fmt.Errorf("rank %d %s: group rank %d name %q, want %d", me, name, grp.Rank(), grp.Name(), ranks[name])
					}
				}
				if m.TPRank() != c.TP || m.PPRank() != c.PP || m.DPRank() != c.DP || m.CPRank() != c.CP || s.Rank(c) != me {
					return fmt.Errorf("rank %d: coordinates %+v inconsistent", me, c)
				}
				return m.Close()
			})
			require.NoError(t, err)
		})
	}
}
