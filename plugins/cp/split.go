package cp

import (
	"fmt"
	"slices"
)

// The splits of a sequence of T tokens over n context-parallel ranks.
const (
	// Contiguous gives rank r chunk r of n equal chunks. Under the causal
	// mask the last rank's queries see the whole sequence and the first
	// rank's only its own chunk: attention work grows with r.
	Contiguous = "contiguous"
	// Zigzag cuts the sequence into 2n equal chunks and gives rank r the
	// chunks r and 2n-1-r: an early chunk and its mirror among the late
	// ones, so every rank's queries see about the same number of keys
	// (see Pairs).
	Zigzag = "zigzag"
)

// Parts is the number of equal chunks a sequence is cut into: n for
// Contiguous, 2n for Zigzag.
func Parts(split string, n int) int {
	if split == Zigzag {
		return 2 * n
	}
	return n
}

// Positions are the global positions, ascending, of the tokens rank r of
// n holds of a sequence of T tokens. T must divide into Parts(split, n).
func Positions(split string, T, n, r int) ([]int, error) {
	if split != Zigzag && split != Contiguous {
		return nil, fmt.Errorf("cp: cp.split=%q is not supported: use %s or %s", split, Zigzag, Contiguous)
	}
	k := Parts(split, n)
	if n < 1 || r < 0 || r >= n || T%k != 0 {
		return nil, fmt.Errorf("cp: block_size %d does not split into %d equal chunks (cp.split=%s over %d ranks); choose block_size a multiple of %d", T, k, split, n, k)
	}
	c := T / k
	chunk := func(i int) []int {
		out := make([]int, c)
		for j := range out {
			out[j] = i*c + j
		}
		return out
	}
	if split == Contiguous {
		return chunk(r), nil
	}
	return slices.Concat(chunk(r), chunk(2*n-1-r)), nil
}

// AllPositions are the positions of every rank of the group, by rank.
func AllPositions(split string, T, n int) ([][]int, error) {
	out := make([][]int, n)
	for r := range out {
		var err error
		if out[r], err = Positions(split, T, n, r); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Pairs counts the (query, key) pairs the causal mask lets queries at
// qpos see among keys at kpos: the work of attention, per head, is
// proportional to it (4·HS FLOPs per pair forward, about twice that
// backward). A key block entirely in the queries' future has none, and
// the ring skips it.
func Pairs(qpos, kpos []int) int64 {
	var n int64
	for _, q := range qpos {
		// kpos is ascending: the visible keys are a prefix.
		k, _ := slices.BinarySearch(kpos, q+1)
		n += int64(k)
	}
	return n
}

// future reports whether every key at kpos comes after every query at
// qpos (both ascending): the block contributes nothing and is skipped.
func future(qpos, kpos []int) bool {
	return len(qpos) == 0 || len(kpos) == 0 || kpos[0] > qpos[len(qpos)-1]
}
