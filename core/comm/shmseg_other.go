//go:build !linux

package comm

import "github.com/tinyacc/tinyacc/core/tensor"

// Shared-memory segments exist on Linux only; elsewhere every group's
// collectives use messages.

type shmSeg struct{}

func (*shmSeg) unmap() {}

func (g *group) segment(*opCtx) (*shmSeg, error) { return nil, nil }

func (*shmSeg) allReduce(*opCtx, tensor.DType, ReduceOp, []byte, int) error {
	panic("unreachable: no segment without shared memory")
}

func (*shmSeg) reduceScatter(*opCtx, tensor.DType, ReduceOp, []byte, []byte) error {
	panic("unreachable: no segment without shared memory")
}

func (*shmSeg) allGatherV(*opCtx, []byte, []byte, []int) error {
	panic("unreachable: no segment without shared memory")
}

func (*shmSeg) broadcast(*opCtx, []byte, int) error {
	panic("unreachable: no segment without shared memory")
}

type spreadColl struct{}

func (*spreadColl) unmap() {}

func (*spreadColl) allReduce(*opCtx, tensor.DType, ReduceOp, []byte, int) error {
	panic("unreachable: no segment without shared memory")
}

func (*spreadColl) reduceScatter(*opCtx, tensor.DType, ReduceOp, []byte, []byte) error {
	panic("unreachable: no segment without shared memory")
}

func (*spreadColl) allGatherV(*opCtx, []byte, []byte, []int) error {
	panic("unreachable: no segment without shared memory")
}

func (*spreadColl) broadcast(*opCtx, []byte, int) error {
	panic("unreachable: no segment without shared memory")
}
