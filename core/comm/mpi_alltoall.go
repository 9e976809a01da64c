//go:build cgo && linux

package comm

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

// All-to-all on the mpi backend is MPI_Ialltoallv on bytes (it moves data
// without combining it, so every dtype is bytes to it). mpi_lib.go loaded
// the library with RTLD_GLOBAL, so its symbols resolve from here.
typedef void* H;
static int (*f_ialltoallv)(const void*, const int*, const int*, H, void*, const int*, const int*, H, H, void*);
static H tac_byte;

// tac_a2a_open resolves MPI_Ialltoallv and MPI_BYTE once; it returns 0, or 1
// when the library lacks them.
static int tac_a2a_open(void) {
	if (f_ialltoallv) return 0;
	*(void**)(&f_ialltoallv) = dlsym(RTLD_DEFAULT, "MPI_Ialltoallv");
	if (!f_ialltoallv) return 1;
	void* ompi = dlsym(RTLD_DEFAULT, "ompi_mpi_byte");
	// MPICH's handles are fixed integers of its mpi.h.
	tac_byte = ompi ? (H)ompi : (H)(uintptr_t)0x4c00010d;
	return 0;
}

static int tac_ialltoallv(void* in, int* sc, int* sd, void* out, int* rc, int* rd, uint64_t c, uint64_t* req) {
	*req = 0;
	return f_ialltoallv(in, sc, sd, tac_byte, out, rc, rd, tac_byte, (H)(uintptr_t)c, req);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"unsafe"

	"github.com/tinyacc/tinyacc/core/tensor"
)

var (
	a2aOnce sync.Once
	a2aErr  error
)

func mpiAllToAllReady() error {
	a2aOnce.Do(func() {
		if C.tac_a2a_open() != 0 {
			a2aErr = errors.New("the MPI library has no MPI_Ialltoallv (MPI 3 or later needed)")
		}
	})
	return a2aErr
}

func (g *mpiGroup) AllToAll(in, out *tensor.Tensor) error { return g.AllToAllAsync(in, out).Wait() }

func (g *mpiGroup) AllToAllAsync(in, out *tensor.Tensor) Handle {
	const name = "all_to_all"
	n := len(g.ranks)
	if err := checkAllToAllArgs(in, out, n); err != nil {
		return g.reject(name, err)
	}
	counts := make([]int, n)
	for r := range counts {
		counts[r] = in.Numel() / n
	}
	return g.allToAllV(name, in, out, counts, counts)
}

func (g *mpiGroup) AllToAllV(in, out *tensor.Tensor, sendCounts, recvCounts []int) error {
	return g.AllToAllVAsync(in, out, sendCounts, recvCounts).Wait()
}

func (g *mpiGroup) AllToAllVAsync(in, out *tensor.Tensor, sendCounts, recvCounts []int) Handle {
	const name = "all_to_all_v"
	if _, _, err := checkAllToAllVArgs(in, out, sendCounts, recvCounts, len(g.ranks)); err != nil {
		return g.reject(name, err)
	}
	return g.allToAllV(name, in, out, sendCounts, recvCounts)
}

// allToAllV passes byte counts and displacements in C memory, which MPI
// reads until the operation completes; MPI counts them in C ints.
func (g *mpiGroup) allToAllV(name string, in, out *tensor.Tensor, sendCounts, recvCounts []int) Handle {
	if err := mpiAllToAllReady(); err != nil {
		return g.reject(name, err)
	}
	n, esz := len(g.ranks), in.DType().Size()
	if max(in.Numel(), out.Numel())*esz > math.MaxInt32 {
		return g.reject(name, fmt.Errorf("%d and %d elements of %s exceed the 2 GiB that MPI counts in a C int; split the exchange", in.Numel(), out.Numel(), in.DType()))
	}
	arr := (*[1 << 28]C.int)(C.malloc(C.size_t(4 * n * int(unsafe.Sizeof(C.int(0))))))[: 4*n : 4*n]
	so, ro := 0, 0
	for r := 0; r < n; r++ {
		arr[r], arr[n+r] = C.int(sendCounts[r]*esz), C.int(so)
		arr[2*n+r], arr[3*n+r] = C.int(recvCounts[r]*esz), C.int(ro)
		so += sendCounts[r] * esz
		ro += recvCounts[r] * esz
	}
	ib, ob := bytesOf(in), bytesOf(out)
	free := func() { C.free(unsafe.Pointer(&arr[0])) }
	h := g.start(name, func(req *C.uint64_t) C.int {
		return C.tac_ialltoallv(bufPtr(ib), &arr[0], &arr[n], bufPtr(ob), &arr[2*n], &arr[3*n], g.comm, req)
	}, free, in, out)
	if f, ok := h.(failed); ok {
		free()
		return f
	}
	return h
}
