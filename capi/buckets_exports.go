package main

/*
#include <stdint.h>
*/
import "C"

import (
	"time"
	"unsafe"

	"github.com/tinyacc/tinyacc/core/comm"
)

//export tinyacc_buffer_register
func tinyacc_buffer_register(data *C.float, n C.int64_t, out *C.int64_t) C.int {
	return call(func() error {
		if err := outPtr("handle", out); err != nil {
			return err
		}
		b, err := f32s("buffer", data, n)
		if err != nil {
			return err
		}
		h, err := apiBufferRegister(b)
		*out = C.int64_t(h)
		return err
	})
}

//export tinyacc_reducer_new
func tinyacc_reducer_new(buffers *C.int64_t, n C.int64_t, timeoutS C.double, traced C.int32_t, out *C.int64_t) C.int {
	return call(func() error {
		if err := outPtr("handle", out); err != nil {
			return err
		}
		k, err := checkCount("buffers", unsafe.Pointer(buffers), n)
		if err != nil {
			return err
		}
		var hs []int64
		if k > 0 {
			for _, h := range unsafe.Slice((*int64)(unsafe.Pointer(buffers)), k) {
				hs = append(hs, h)
			}
		}
		h, err := apiReducerNew(hs, float64(timeoutS), traced != 0)
		*out = C.int64_t(h)
		return err
	})
}

// apiReducerNew builds a reducer over registered buffers on the world group.
func apiReducerNew(handles []int64, timeoutS float64, traced bool) (int64, error) {
	if len(handles) == 0 {
		return 0, fail(errInvalidArg, "reducer_new: no buckets")
	}
	if timeoutS <= 0 {
		return 0, fail(errInvalidArg, "reducer_new: timeout %v s must be positive (comm.timeout)", timeoutS)
	}
	bufs := make([]*bufferObj, len(handles))
	for i, h := range handles {
		b, err := get[bufferObj](h)
		if err != nil {
			return 0, err
		}
		bufs[i] = b
	}
	rank, _, err := apiDistInit()
	if err != nil {
		return 0, err
	}
	run := func(fn func(g comm.Group) error) error { return withWorld(fn) }
	return register(newReducer(bufs, run, rank, time.Duration(timeoutS*float64(time.Second)), traced)), nil
}

//export tinyacc_reducer_reduce_dtype
func tinyacc_reducer_reduce_dtype(reducer C.int64_t, dtype *C.char) C.int {
	return call(func() error {
		r, err := get[reducerObj](int64(reducer))
		if err != nil {
			return err
		}
		d, err := cString("dtype", dtype, false)
		if err != nil {
			return err
		}
		return r.setReduceDType(d)
	})
}

//export tinyacc_bucket_ready
func tinyacc_bucket_ready(reducer C.int64_t, bucket C.int64_t) C.int {
	return call(func() error {
		r, err := get[reducerObj](int64(reducer))
		if err != nil {
			return err
		}
		return r.bucketReady(int(bucket))
	})
}

//export tinyacc_buckets_wait
func tinyacc_buckets_wait(reducer C.int64_t) C.int {
	return call(func() error {
		r, err := get[reducerObj](int64(reducer))
		if err != nil {
			return err
		}
		return r.waitAll()
	})
}

//export tinyacc_reducer_trace
func tinyacc_reducer_trace(reducer C.int64_t, path *C.char) C.int {
	return call(func() error {
		r, err := get[reducerObj](int64(reducer))
		if err != nil {
			return err
		}
		p, err := cString("path", path, false)
		if err != nil {
			return err
		}
		if r.rec == nil {
			return fail(errState, "reducer_trace: the reducer was created without tracing")
		}
		return wrap(errIO, r.rec.WriteFile(p))
	})
}
