package comm

import (
	"fmt"
	"strings"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// The argument rules of every backend's public operations, written once:
// a call that breaks one fails on the caller's goroutine, before any work
// and without using up a sequence number, with a message that says what to
// change. ops.go and mpi_group.go check with these.

// checkReduceArgs: AllReduce and the tensor and op of Reduce.
func checkReduceArgs(t *tensor.Tensor, op ReduceOp) error {
	if err := checkTensors(t); err != nil {
		return err
	}
	return checkOp(op, t.DType())
}

func checkReduceScatterArgs(in, out *tensor.Tensor, op ReduceOp, n int) error {
	if err := checkTensors(in, out); err != nil {
		return err
	}
	if err := checkOp(op, in.DType()); err != nil {
		return err
	}
	if in.Numel() != out.Numel()*n {
		return fmt.Errorf("input has %d elements, want group size %d × output %d = %d",
			in.Numel(), n, out.Numel(), out.Numel()*n)
	}
	return nil
}

func checkAllGatherArgs(in, out *tensor.Tensor, n int) error {
	if err := checkTensors(in, out); err != nil {
		return err
	}
	if out.Numel() != in.Numel()*n {
		return fmt.Errorf("output has %d elements, want group size %d × input %d = %d",
			out.Numel(), n, in.Numel(), in.Numel()*n)
	}
	return nil
}

// checkAllGatherVArgs checks AllGatherV's arguments for group rank me of n
// and returns where each rank's block starts in out, in elements (n+1
// offsets, the last the total).
func checkAllGatherVArgs(in, out *tensor.Tensor, counts []int, me, n int) ([]int, error) {
	if err := checkTensors(in, out); err != nil {
		return nil, err
	}
	if len(counts) != n {
		return nil, fmt.Errorf("%d counts for a group of size %d", len(counts), n)
	}
	off := make([]int, n+1)
	for r, k := range counts {
		if k < 0 {
			return nil, fmt.Errorf("negative count %d for rank %d", k, r)
		}
		off[r+1] = off[r] + k
	}
	if in.Numel() != counts[me] {
		return nil, fmt.Errorf("input has %d elements but counts[%d] = %d", in.Numel(), me, counts[me])
	}
	if out.Numel() != off[n] {
		return nil, fmt.Errorf("output has %d elements, want the sum of counts %d", out.Numel(), off[n])
	}
	return off, nil
}

func checkRoot(root, n int) error {
	if root < 0 || root >= n {
		return fmt.Errorf("root %d is outside the group of size %d", root, n)
	}
	return nil
}

// checkPeerArgs: Send and Recv to or from group rank peer.
func checkPeerArgs(t *tensor.Tensor, peer, me, n int) error {
	if err := checkTensors(t); err != nil {
		return err
	}
	if peer < 0 || peer >= n || peer == me {
		return fmt.Errorf("peer %d is not another rank of the group of size %d", peer, n)
	}
	return nil
}

// subGroupName is the name NewGroup gives a sub-group: the parent's name
// and the ranks, "world[0,2]".
func subGroupName(parent string, ranks []int) string {
	strs := make([]string, len(ranks))
	for i, r := range ranks {
		strs[i] = fmt.Sprint(r)
	}
	return fmt.Sprintf("%s[%s]", parent, strings.Join(strs, ","))
}

// checkSubGroup checks the rank list of NewNamedGroup against the parent
// (name, world ranks of its members, this rank's position me) and returns
// this rank's position in the sub-group (-1 when it is not a member) and
// the sub-group's world ranks.
func checkSubGroup(name, parent string, parentRanks []int, me int, ranks []int) (int, []int, error) {
	if len(ranks) == 0 {
		return -1, nil, fmt.Errorf("comm: new group %q of group %q: empty rank list", name, parent)
	}
	seen := map[int]bool{}
	pos := -1
	for i, r := range ranks {
		if r < 0 || r >= len(parentRanks) {
			return -1, nil, fmt.Errorf("comm: new group %q: rank %d is outside group %q of size %d", name, r, parent, len(parentRanks))
		}
		if seen[r] {
			return -1, nil, fmt.Errorf("comm: new group %q: rank %d listed twice in %v", name, r, ranks)
		}
		seen[r] = true
		if r == me {
			pos = i
		}
	}
	world := make([]int, len(ranks))
	for i, r := range ranks {
		world[i] = parentRanks[r]
	}
	return pos, world, nil
}
