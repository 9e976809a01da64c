package place

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// world enumerates the coordinates of a mesh of the given sizes.
func world(size [NumAxes]int) []Coord {
	var out []Coord
	var rec func(a Axis, c Coord)
	rec = func(a Axis, c Coord) {
		if a == NumAxes {
			out = append(out, c)
			return
		}
		for i := 0; i < size[a]; i++ {
			c.Rank[a] = i
			rec(a+1, c)
		}
	}
	rec(0, Coord{Size: size})
	return out
}

func count(n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = float64(i + 1)
	}
	return v
}

// roundTrip scatters a global tensor to every rank of the mesh with the
// spec each rank's placement gives, then gathers the owners' parts back
// into a zeroed tensor by summing, as GatherParam does over a group.
func roundTrip(t *testing.T, size [NumAxes]int, spec func(c Coord) *Spec) {
	t.Helper()
	ranks := world(size)
	s0 := spec(ranks[0])
	global := count(s0.Numel())
	sum := make([]float64, len(global))
	counted := make([]int, len(global))
	for _, c := range ranks {
		s := spec(c)
		require.NoError(t, s.Validate())
		data := make([]float64, s.HeldElements(c))
		Scatter(s, c, global, data)
		own, err := s.Owns(c)
		require.NoError(t, err)
		if !own {
			continue
		}
		part := make([]float64, len(global))
		Gather(s, c, data, part)
		s.Runs(c, func(g, _, n int) {
			for i := g; i < g+n; i++ {
				counted[i]++
			}
		})
		for i := range sum {
			sum[i] += part[i]
		}
	}
	require.Equal(t, global, sum, "owners' parts add up to the global tensor")
	for i, n := range counted {
		require.Equal(t, 1, n, "element %d owned %d times", i, n)
	}
}

func TestRoundTrips(t *testing.T) {
	shape := []int{6, 9}
	t.Run("replicated", func(t *testing.T) {
		roundTrip(t, [NumAxes]int{2, 2, 1, 2}, func(c Coord) *Spec { return NewSpec("w", shape) })
	})
	t.Run("even shard", func(t *testing.T) {
		roundTrip(t, [NumAxes]int{1, 2, 1, 3}, func(c Coord) *Spec {
			s := NewSpec("w", shape)
			s.Along[TP] = Placement{Kind: Shard, Dim: 1, Offset: 3 * c.Rank[TP], Length: 3}
			return s
		})
	})
	t.Run("uneven shard", func(t *testing.T) {
		// 6 rows over 4 ranks: 2, 2, 1, 1.
		lo := []int{0, 2, 4, 5, 6}
		roundTrip(t, [NumAxes]int{1, 1, 1, 4}, func(c Coord) *Spec {
			s := NewSpec("w", shape)
			r := c.Rank[TP]
			s.Along[TP] = Placement{Kind: Shard, Dim: 0, Offset: lo[r], Length: lo[r+1] - lo[r]}
			return s
		})
	})
	t.Run("q|k|v blocks", func(t *testing.T) {
		roundTrip(t, [NumAxes]int{1, 2, 1, 3}, func(c Coord) *Spec {
			s := NewSpec("c_attn", shape)
			s.Along[TP] = Placement{Kind: Shard, Dim: 1, Blocks: 3, Offset: c.Rank[TP], Length: 1}
			return s
		})
	})
	t.Run("stage subset", func(t *testing.T) {
		// The tied table on the first and last of 3 stages.
		roundTrip(t, [NumAxes]int{3, 2, 1, 1}, func(c Coord) *Spec {
			s := NewSpec("wte", shape)
			s.Along[PP] = Placement{Kind: Held, Ranks: []int{0, 2}}
			return s
		})
	})
	t.Run("zero flat over a tp shard", func(t *testing.T) {
		// TP splits the 9 columns 4 + 5, then ZeRO cuts each TP shard
		// (24 or 30 elements) into 4 flat ranges, the last one shorter.
		roundTrip(t, [NumAxes]int{1, 4, 1, 2}, func(c Coord) *Spec {
			s := NewSpec("w", shape)
			s.Along[TP] = Placement{Kind: Shard, Dim: 1, Offset: 4 * c.Rank[TP], Length: []int{4, 5}[c.Rank[TP]]}
			n := 6 * s.Along[TP].Length
			chunk := (n + 3) / 4
			lo := min(n, chunk*c.Rank[DP])
			s.Along[DP] = Placement{Kind: Flat, Offset: lo, Length: min(n, lo+chunk) - lo}
			return s
		})
	})
}

func TestPiecesOfQKVShard(t *testing.T) {
	s := NewSpec("h.0.attn.c_attn.weight", []int{4, 12})
	s.Along[TP] = Placement{Kind: Shard, Dim: 1, Blocks: 3, Offset: 2, Length: 2}
	c := Coord{Rank: [NumAxes]int{TP: 1}, Size: [NumAxes]int{1, 1, 1, 2}}
	var got []string
	for _, p := range s.Pieces(c) {
		got = append(got, p.Global.String()+"->"+p.Local.String())
	}
	require.Equal(t, []string{"[0:4, 2:4]->[0:4, 0:2]", "[0:4, 6:8]->[0:4, 2:4]", "[0:4, 10:12]->[0:4, 4:6]"}, got)
	require.Equal(t, []int{4, 6}, s.LocalShape())
	require.Equal(t, "h.0.attn.c_attn.weight [4 12]: tp shard(dim 1, 3 blocks, [2:4))", s.String())
}

// TestNormFromOwnedSquares: per-rank sums of squares over owned elements,
// added over ranks, give the single-process norm, for a two-way sharded
// tensor, a replicated one and a tied tensor held on two stages.
func TestNormFromOwnedSquares(t *testing.T) {
	size := [NumAxes]int{2, 2, 1, 2}
	tensors := []func(c Coord) *Spec{
		func(c Coord) *Spec { // c_fc-like, columns split over tp
			s := NewSpec("fc", []int{3, 8})
			s.Along[TP] = Placement{Kind: Shard, Dim: 1, Offset: 4 * c.Rank[TP], Length: 4}
			s.Along[PP] = Placement{Kind: Held, Ranks: []int{1}}
			return s
		},
		func(c Coord) *Spec { return NewSpec("ln", []int{5}) },
		func(c Coord) *Spec { // the tied wte, vocabulary rows split over tp, on both stages
			s := NewSpec("wte", []int{6, 3})
			s.Along[TP] = Placement{Kind: Shard, Dim: 0, Offset: 3 * c.Rank[TP], Length: 3}
			s.Along[PP] = Placement{Kind: Held, Ranks: []int{0, 1}}
			return s
		},
	}
	var want float64
	globals := make([][]float64, len(tensors))
	for i, f := range tensors {
		globals[i] = count(f(Coord{Size: size}).Numel())
		for _, v := range globals[i] {
			want += v * v
		}
	}
	var got float64
	for _, c := range world(size) {
		for i, f := range tensors {
			s := f(c)
			data := make([]float64, s.HeldElements(c))
			Scatter(s, c, globals[i], data)
			if own, err := s.Owns(c); err != nil || !own {
				require.NoError(t, err)
				continue
			}
			for _, v := range data {
				got += v * v
			}
		}
	}
	require.Equal(t, math.Sqrt(want), math.Sqrt(got))
}

func TestOwnsRefusesPendingSums(t *testing.T) {
	s := NewSpec("h.0.ln_1.weight", []int{4})
	s.Along[TP] = Placement{Kind: Partial}
	_, err := s.Owns(Coord{Size: [NumAxes]int{1, 1, 1, 2}})
	require.EqualError(t, err, "place: h.0.ln_1.weight is a pending sum along tp; reduce it before counting its elements")
}

func TestValidate(t *testing.T) {
	s := NewSpec("w", []int{4, 6})
	s.Along[TP] = Placement{Kind: Shard, Dim: 1, Offset: 4, Length: 3}
	require.EqualError(t, s.Validate(), "place: w: shard(dim 1, [4:7)) along tp is outside shape [4 6]")
	s.Along[TP] = Placement{Kind: Shard, Dim: 1, Blocks: 4}
	require.EqualError(t, s.Validate(), "place: w: shard(dim 1, 4 blocks, [0:0)) along tp does not fit shape [4 6]")
	s.Along[TP] = Placement{Kind: Shard, Dim: 0, Length: 2}
	s.Along[CP] = Placement{Kind: Shard, Dim: 0, Length: 2}
	require.EqualError(t, s.Validate(), "place: w is sharded twice along dimension 0; one axis per dimension")
	s.Along[CP] = Placement{}
	s.Along[DP] = Placement{Kind: Flat, Offset: 10, Length: 3}
	require.EqualError(t, s.Validate(), "place: w: flat[10:13) is outside the 12 local elements")
}
