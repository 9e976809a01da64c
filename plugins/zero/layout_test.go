package zero

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tinyacc/tinyacc/core/nn"
	"github.com/tinyacc/tinyacc/core/place"
	"github.com/tinyacc/tinyacc/core/tensor"
)

func tinyGPT(t *testing.T) *nn.GPT {
	m, err := nn.NewGPT(nn.GPTConfig{NLayer: 2, NHead: 2, NEmbd: 8, BlockSize: 5, VocabSize: 11}, 1, tensor.Float32, tensor.NewAllocator())
	require.NoError(t, err)
	return m
}

func TestLayoutUnitsAndPadding(t *testing.T) {
	m := tinyGPT(t)
	l, err := NewLayout(m, 3, 1)
	require.NoError(t, err)
	require.Equal(t, []string{"embed", "h.0", "h.1", "head"}, func() []string {
		var s []string
		for _, u := range l.Units {
			s = append(s, u.Name)
		}
		return s
	}())
	// embed: wte 11x8 + wpe 5x8 = 128 -> 129; block 12*64+13*8 = 872 -> 873;
	// head: ln_f 2*8 = 16 -> 18.
	for i, want := range []struct{ numel, size int }{{128, 129}, {872, 873}, {872, 873}, {16, 18}} {
		u := l.Units[i]
		require.Equal(t, want.numel, u.Numel, u.Name)
		require.Equal(t, want.size, u.Size, u.Name)
		require.Equal(t, want.size/3, u.Shard, u.Name)
	}
	e := l.Units[0]
	require.Equal(t, []Range{
		{Name: "wte.weight", Param: m.Embed.Wte, Offset: 0, Numel: 88, Decay: true},
		{Name: "wpe.weight", Param: m.Embed.Wpe, Offset: 88, Numel: 40, Decay: true},
	}, e.Ranges)
	require.Equal(t, []int{0}, l.Units[3].Uses, "the head reads the embed unit's wte")
	require.True(t, e.Lookup, "the embed unit's backward reads no parameter")
	for _, u := range l.Units[1:] {
		require.False(t, u.Lookup, u.Name)
	}
	require.Equal(t, 3, l.UnitOf(m.Head.LnB))
	require.Equal(t, -1, l.UnitOf(tensor.New(tensor.Float32, 1)))
	// Rank 1 owns embed elements [43, 86): part of wte only.
	require.Equal(t, []Piece{{Range: &e.Ranges[0], Lo: 43, Hi: 86, At: 0}}, l.Pieces(e))
	require.Equal(t, "wte.weight[43:86]", l.Pieces(e)[0].ViewName())
}

// TestPiecesPartitionParameters checks, for several group sizes, that the
// ranks' pieces cover every element of every parameter exactly once, and
// that each piece sits at the right place of its rank's shard.
func TestPiecesPartitionParameters(t *testing.T) {
	m := tinyGPT(t)
	for _, n := range []int{1, 2, 3, 4, 7} {
		seen := map[string][]int{}
		for _, p := range m.Params() {
			seen[p.Name] = make([]int, p.Numel())
		}
		for r := 0; r < n; r++ {
			l, err := NewLayout(m, n, r)
			require.NoError(t, err)
			for _, u := range l.Units {
				require.Zero(t, u.Size%n)
				require.Less(t, u.Size-u.Numel, n, "padding below one element per rank")
				for _, pc := range l.Pieces(u) {
					for i := pc.Lo; i < pc.Hi; i++ {
						seen[pc.Range.Name][i]++
					}
					// The piece's first flat element, seen from the shard.
					require.Equal(t, pc.Range.Offset+pc.Lo, l.Lo(u)+pc.At, "n=%d rank %d %s", n, r, pc.ViewName())
					require.LessOrEqual(t, pc.At+pc.Hi-pc.Lo, u.Shard)
				}
			}
		}
		for name, c := range seen {
			for i, k := range c {
				require.Equal(t, 1, k, fmt.Sprintf("n=%d: element %d of %s owned %d times", n, i, name, k))
			}
		}
	}
}

func TestLayoutErrors(t *testing.T) {
	m := tinyGPT(t)
	_, err := NewLayout(m, 2, 2)
	require.EqualError(t, err, "zero: layout for rank 2 of a group of 2: the rank must be in [0, size)")
	// A float64 model (train.dtype) lays out as a float32 one does.
	m64, err := nn.NewGPT(nn.GPTConfig{NLayer: 1, NHead: 1, NEmbd: 4, BlockSize: 2, VocabSize: 3}, 1, tensor.Float64, tensor.NewAllocator())
	require.NoError(t, err)
	l, err := NewLayout(m64, 2, 0)
	require.NoError(t, err)
	require.Len(t, l.Units, len(m64.Modules()))
}

// TestLayoutOfStageChunks: a rank holding two chunks of blocks (an
// interleaved pipeline's first rank: the embedding, h.0 and h.2) lays out
// all of them and nothing else; the last stage's own wte lives in its
// head unit, with no tie to another unit.
func TestLayoutOfStageChunks(t *testing.T) {
	cfg := nn.GPTConfig{NLayer: 4, NHead: 2, NEmbd: 8, BlockSize: 5, VocabSize: 11}
	first, err := nn.NewStage(cfg, 1, tensor.Float32, tensor.NewAllocator(), [][2]int{{0, 1}, {2, 3}})
	require.NoError(t, err)
	l, err := NewLayout(first, 2, 0)
	require.NoError(t, err)
	var names []string
	for _, u := range l.Units {
		names = append(names, u.Name)
	}
	require.Equal(t, []string{"embed", "h.0", "h.2"}, names)
	require.True(t, l.Units[0].Lookup, "the first stage's embed unit")

	last, err := nn.NewStage(cfg, 1, tensor.Float32, tensor.NewAllocator(), [][2]int{{1, 2}, {3, 4}})
	require.NoError(t, err)
	l, err = NewLayout(last, 2, 1)
	require.NoError(t, err)
	names = nil
	for _, u := range l.Units {
		names = append(names, u.Name)
	}
	require.Equal(t, []string{"h.1", "h.3", "head"}, names)
	head := l.Units[2]
	require.Equal(t, "wte.weight", head.Ranges[2].Name, "the last stage's copy of the tied table")
	require.Empty(t, head.Uses)
	for _, u := range l.Units {
		require.False(t, u.Lookup, "%s: the last stage has no embedding", u.Name)
	}
}

// Parameters held by some ranks of the group only (an expert placed by
// expert parallel) form, per module, a unit of their own after the
// module's other unit, sharded over the group of their holders with this
// rank's place in it; without that group they stay whole.
func TestLayoutHeldUnits(t *testing.T) {
	m, err := nn.NewGPT(nn.GPTConfig{NLayer: 2, NHead: 2, NEmbd: 8, BlockSize: 5, VocabSize: 11,
		MoE: nn.MoEConfig{Experts: 2, TopK: 1, Every: 2}}, 1, tensor.Float32, tensor.NewAllocator())
	require.NoError(t, err)
	experts := 0
	for _, p := range m.Params() {
		if _, ok := nn.ExpertOf(p.Name); ok {
			p.Spec.Along[place.DP] = place.Placement{Kind: place.Held, Ranks: []int{1, 3}}
			experts += p.Numel()
		}
	}
	require.Equal(t, 2*(8*32+32+32*8+8), experts)
	l, err := NewLayoutHeld(m, 4, 3, 2, 1)
	require.NoError(t, err)
	var names []string
	for _, u := range l.Units {
		names = append(names, fmt.Sprintf("%s %d/%d", u.Name, u.Rank, u.N))
	}
	require.Equal(t, []string{"embed 3/4", "h.0 3/4", "h.1 3/4", "h.1.held 1/2", "head 3/4"}, names)
	h := l.Units[3]
	require.True(t, h.Held)
	require.Equal(t, experts, h.Numel)
	require.Equal(t, experts, h.Size, "even: no padding over 2")
	require.Equal(t, experts/2, h.Shard)
	require.Equal(t, experts/2, l.Lo(h), "the second of the two holders owns the second half")
	require.Empty(t, l.Whole)
	require.Equal(t, 3, l.UnitOf(m.Blocks()[1].MoE.Experts[1].ProjB))
	whole, err := NewLayout(m, 4, 3)
	require.NoError(t, err)
	require.Len(t, whole.Whole, 8, "without a group of holders the experts stay whole")
	_, err = NewLayoutHeld(m, 4, 3, 2, 2)
	require.EqualError(t, err, "zero: layout for rank 2 of a group of 2 holders: the rank must be in [0, size)")
}
