package main

/*
#include <stdint.h>
*/
import "C"

import (
	"github.com/tinyacc/tinyacc/core/comm"
	"github.com/tinyacc/tinyacc/core/tensor"
)

//export tinyacc_dist_init
func tinyacc_dist_init(rank, size *C.int64_t) C.int {
	return call(func() error {
		r, s, err := apiDistInit()
		if rank != nil {
			*rank = C.int64_t(r)
		}
		if size != nil {
			*size = C.int64_t(s)
		}
		return err
	})
}

//export tinyacc_dist_init_config
func tinyacc_dist_init_config(config C.int64_t, rank, size *C.int64_t) C.int {
	return call(func() error {
		r, s, err := apiDistInitConfig(int64(config))
		if rank != nil {
			*rank = C.int64_t(r)
		}
		if size != nil {
			*size = C.int64_t(s)
		}
		return err
	})
}

//export tinyacc_dist_finalize
func tinyacc_dist_finalize() C.int {
	return call(apiDistFinalize)
}

//export tinyacc_all_reduce
func tinyacc_all_reduce(buf *C.float, n C.int64_t, op C.int32_t) C.int {
	return call(func() error {
		b, err := f32s("buffer", buf, n)
		if err != nil {
			return err
		}
		return withWorld(func(g comm.Group) error { return allReduce(g, b, int(op)) })
	})
}

//export tinyacc_all_gather
func tinyacc_all_gather(in *C.float, n C.int64_t, out *C.float, outN C.int64_t) C.int {
	return call(func() error {
		src, err := f32s("input", in, n)
		if err != nil {
			return err
		}
		dst, err := f32s("output", out, outN)
		if err != nil {
			return err
		}
		return withWorld(func(g comm.Group) error { return allGather(g, src, dst) })
	})
}

//export tinyacc_reduce_scatter
func tinyacc_reduce_scatter(in *C.float, inN C.int64_t, out *C.float, outN C.int64_t, op C.int32_t) C.int {
	return call(func() error {
		src, err := f32s("input", in, inN)
		if err != nil {
			return err
		}
		dst, err := f32s("output", out, outN)
		if err != nil {
			return err
		}
		return withWorld(func(g comm.Group) error { return reduceScatter(g, src, dst, int(op)) })
	})
}

//export tinyacc_reduce_scatter_as
func tinyacc_reduce_scatter_as(in *C.float, inN C.int64_t, out *C.float, outN C.int64_t, op C.int32_t, dtype *C.char) C.int {
	return call(func() error {
		src, dst, dt, err := reduceScatterArgs(in, inN, out, outN, dtype)
		if err != nil {
			return err
		}
		return withWorld(func(g comm.Group) error { return reduceScatterAs(g, src, dst, int(op), dt) })
	})
}

//export tinyacc_reduce_scatter_start_as
func tinyacc_reduce_scatter_start_as(in *C.float, inN C.int64_t, out *C.float, outN C.int64_t, op C.int32_t, dtype *C.char, pending *C.int64_t) C.int {
	return call(func() error {
		if err := outPtr("handle", pending); err != nil {
			return err
		}
		src, dst, dt, err := reduceScatterArgs(in, inN, out, outN, dtype)
		if err != nil {
			return err
		}
		h, err := apiReduceScatterStartAs(src, dst, int(op), dt)
		*pending = C.int64_t(h)
		return err
	})
}

// reduceScatterArgs reads the arguments of the reduce_scatter_as pair.
func reduceScatterArgs(in *C.float, inN C.int64_t, out *C.float, outN C.int64_t, dtype *C.char) (src, dst []float32, dt tensor.DType, err error) {
	if dtype == nil {
		return nil, nil, 0, fail(errInvalidArg, "reduce_scatter_as: dtype is NULL: pass \"fp32\" or \"bf16\"")
	}
	if dt, err = reduceDTypeOf(C.GoString(dtype)); err != nil {
		return nil, nil, 0, err
	}
	if src, err = f32s("input", in, inN); err != nil {
		return nil, nil, 0, err
	}
	if dst, err = f32s("output", out, outN); err != nil {
		return nil, nil, 0, err
	}
	return src, dst, dt, nil
}

//export tinyacc_broadcast
func tinyacc_broadcast(buf *C.float, n C.int64_t, root C.int32_t) C.int {
	return call(func() error {
		b, err := f32s("buffer", buf, n)
		if err != nil {
			return err
		}
		return withWorld(func(g comm.Group) error { return broadcast(g, b, int(root)) })
	})
}

//export tinyacc_barrier
func tinyacc_barrier() C.int {
	return call(func() error { return withWorld(barrier) })
}

//export tinyacc_comm_sent_bytes
func tinyacc_comm_sent_bytes(sent *C.int64_t) C.int {
	return call(func() error {
		if err := outPtr("sent", sent); err != nil {
			return err
		}
		n, err := apiCommSentBytes()
		*sent = C.int64_t(n)
		return err
	})
}

//export tinyacc_reduce_scatter_start
func tinyacc_reduce_scatter_start(in *C.float, inN C.int64_t, out *C.float, outN C.int64_t, op C.int32_t, pending *C.int64_t) C.int {
	return call(func() error {
		if err := outPtr("handle", pending); err != nil {
			return err
		}
		src, err := f32s("input", in, inN)
		if err != nil {
			return err
		}
		dst, err := f32s("output", out, outN)
		if err != nil {
			return err
		}
		h, err := apiReduceScatterStart(src, dst, int(op))
		*pending = C.int64_t(h)
		return err
	})
}

//export tinyacc_collective_wait
func tinyacc_collective_wait(pending C.int64_t) C.int {
	return call(func() error { return apiCollectiveWait(int64(pending)) })
}
