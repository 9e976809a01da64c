//go:build cgo && linux

package comm

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// Every MPI handle travels as a 64-bit word: a pointer in Open MPI's ABI, an
// int in MPICH's. Integer arguments are passed in the same registers either
// way, and output handles are written into zeroed 8-byte slots.
typedef void* H;

static void* tac_lib;
static int tac_abi; // 1 Open MPI, 2 MPICH
static H tac_world, tac_float, tac_double, tac_int, tac_u16, tac_sum, tac_max, tac_min, tac_errors_return;
static void* tac_in_place;
static void* tac_status_ignore;

static int (*f_init_thread)(int*, char***, int, int*);
static int (*f_finalize)(void);
static int (*f_comm_rank)(H, int*);
static int (*f_comm_size)(H, int*);
static int (*f_comm_set_errhandler)(H, H);
static int (*f_error_string)(int, char*, int*);
static int (*f_comm_split)(H, int, int, void*);
static int (*f_comm_free)(void*);
static int (*f_iallreduce)(const void*, void*, int, H, H, H, void*);
static int (*f_ireduce_scatter_block)(const void*, void*, int, H, H, H, void*);
static int (*f_iallgatherv)(const void*, int, H, void*, const int*, const int*, H, H, void*);
static int (*f_ibcast)(void*, int, H, int, H, void*);
static int (*f_ireduce)(const void*, void*, int, H, H, int, H, void*);
static int (*f_ibarrier)(H, void*);
static int (*f_isend)(const void*, int, H, int, int, H, void*);
static int (*f_irecv)(void*, int, H, int, int, H, void*);
static int (*f_test)(void*, int*, void*);

#define TAC_SYM(var, name) do { *(void**)(&var) = dlsym(tac_lib, name); if (!var) return name; } while (0)
#define TAC_OBJ(var, name) do { var = dlsym(tac_lib, name); if (!var) return name; } while (0)

// tac_mpi_open loads the library and resolves what the backend uses; it
// returns NULL, or the name of what is missing ("dlopen" when the library
// itself could not be loaded, with the reason in dlerror()).
static const char* tac_mpi_open(const char* path) {
	tac_lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
	if (!tac_lib) return "dlopen";
	if (dlsym(tac_lib, "ompi_mpi_comm_world")) {
		tac_abi = 1;
		TAC_OBJ(tac_world, "ompi_mpi_comm_world");
		TAC_OBJ(tac_float, "ompi_mpi_float");
		TAC_OBJ(tac_double, "ompi_mpi_double");
		TAC_OBJ(tac_int, "ompi_mpi_int");
		TAC_OBJ(tac_u16, "ompi_mpi_uint16_t");
		TAC_OBJ(tac_sum, "ompi_mpi_op_sum");
		TAC_OBJ(tac_max, "ompi_mpi_op_max");
		TAC_OBJ(tac_min, "ompi_mpi_op_min");
		TAC_OBJ(tac_errors_return, "ompi_mpi_errors_return");
		tac_in_place = (void*)1;
		tac_status_ignore = NULL;
	} else {
		// MPICH's handles are fixed integers of its mpi.h.
		tac_abi = 2;
		tac_world = (H)(uintptr_t)0x44000000;
		tac_float = (H)(uintptr_t)0x4c00040a;
		tac_double = (H)(uintptr_t)0x4c00080b;
		tac_int = (H)(uintptr_t)0x4c000405;
		tac_u16 = (H)(uintptr_t)0x4c00023c; // MPI_UINT16_T
		tac_sum = (H)(uintptr_t)0x58000003;
		tac_max = (H)(uintptr_t)0x58000001;
		tac_min = (H)(uintptr_t)0x58000002;
		tac_errors_return = (H)(uintptr_t)0x54000001;
		tac_in_place = (void*)(intptr_t)-1;
		tac_status_ignore = (void*)1;
	}
	TAC_SYM(f_init_thread, "MPI_Init_thread");
	TAC_SYM(f_finalize, "MPI_Finalize");
	TAC_SYM(f_comm_rank, "MPI_Comm_rank");
	TAC_SYM(f_comm_size, "MPI_Comm_size");
	TAC_SYM(f_comm_set_errhandler, "MPI_Comm_set_errhandler");
	TAC_SYM(f_error_string, "MPI_Error_string");
	TAC_SYM(f_comm_split, "MPI_Comm_split");
	TAC_SYM(f_comm_free, "MPI_Comm_free");
	TAC_SYM(f_iallreduce, "MPI_Iallreduce");
	TAC_SYM(f_ireduce_scatter_block, "MPI_Ireduce_scatter_block");
	TAC_SYM(f_iallgatherv, "MPI_Iallgatherv");
	TAC_SYM(f_ibcast, "MPI_Ibcast");
	TAC_SYM(f_ireduce, "MPI_Ireduce");
	TAC_SYM(f_ibarrier, "MPI_Ibarrier");
	TAC_SYM(f_isend, "MPI_Isend");
	TAC_SYM(f_irecv, "MPI_Irecv");
	TAC_SYM(f_test, "MPI_Test");
	return NULL;
}

static const char* tac_dlerror(void) { return dlerror(); }

static H tac_dtype(int code) { return code == 0 ? tac_float : code == 1 ? tac_double : code == 2 ? tac_int : tac_u16; }
static H tac_op(int code) { return code == 0 ? tac_sum : code == 1 ? tac_max : tac_min; }
static void* tac_buf(void* p, int inplace) { return inplace ? tac_in_place : p; }

// tac_init starts MPI with the calling thread as the only one that calls
// it, and makes errors on the world communicator return instead of abort.
int tac_init(int* provided) {
	int rc = f_init_thread(NULL, NULL, 1, provided); // MPI_THREAD_FUNNELED
	if (rc) return rc;
	return f_comm_set_errhandler(tac_world, tac_errors_return);
}
int tac_finalize(void) { return f_finalize(); }
uint64_t tac_world_comm(void) { return (uint64_t)(uintptr_t)tac_world; }
int tac_rank(uint64_t c, int* r) { return f_comm_rank((H)(uintptr_t)c, r); }
int tac_size(uint64_t c, int* s) { return f_comm_size((H)(uintptr_t)c, s); }
static void tac_errstr(int rc, char* buf, int n) {
	int len = 0;
	char tmp[1024];
	if (f_error_string(rc, tmp, &len) != 0) len = 0;
	if (len >= n) len = n - 1;
	memcpy(buf, tmp, len);
	buf[len] = 0;
}
int tac_split(uint64_t c, int color, int key, uint64_t* out) {
	*out = 0;
	int rc = f_comm_split((H)(uintptr_t)c, color, key, out);
	if (rc == 0 && color != -32766) rc = f_comm_set_errhandler((H)(uintptr_t)*out, tac_errors_return);
	return rc;
}
int tac_free(uint64_t* c) { return f_comm_free(c); }
int tac_iallreduce(void* buf, int n, int dt, int op, uint64_t c, uint64_t* req) {
	*req = 0;
	return f_iallreduce(tac_in_place, buf, n, tac_dtype(dt), tac_op(op), (H)(uintptr_t)c, req);
}
int tac_ireduce_scatter(void* in, void* out, int n, int dt, int op, uint64_t c, uint64_t* req) {
	*req = 0;
	return f_ireduce_scatter_block(in, out, n, tac_dtype(dt), tac_op(op), (H)(uintptr_t)c, req);
}
int tac_iallgatherv(void* in, int n, void* out, int* counts, int* displs, int dt, uint64_t c, uint64_t* req) {
	*req = 0;
	return f_iallgatherv(in, n, tac_dtype(dt), out, counts, displs, tac_dtype(dt), (H)(uintptr_t)c, req);
}
int tac_ibcast(void* buf, int n, int dt, int root, uint64_t c, uint64_t* req) {
	*req = 0;
	return f_ibcast(buf, n, tac_dtype(dt), root, (H)(uintptr_t)c, req);
}
int tac_ireduce(void* buf, int n, int dt, int op, int root, int isroot, uint64_t c, uint64_t* req) {
	*req = 0;
	// The root reduces in place; the others only send.
	return f_ireduce(isroot ? tac_in_place : buf, isroot ? buf : NULL, n, tac_dtype(dt), tac_op(op), root, (H)(uintptr_t)c, req);
}
int tac_ibarrier(uint64_t c, uint64_t* req) {
	*req = 0;
	return f_ibarrier((H)(uintptr_t)c, req);
}
int tac_isend(void* buf, int n, int dt, int to, uint64_t c, uint64_t* req) {
	*req = 0;
	return f_isend(buf, n, tac_dtype(dt), to, 0, (H)(uintptr_t)c, req);
}
int tac_irecv(void* buf, int n, int dt, int from, uint64_t c, uint64_t* req) {
	*req = 0;
	return f_irecv(buf, n, tac_dtype(dt), from, 0, (H)(uintptr_t)c, req);
}
int tac_test(uint64_t* req, int* flag) { return f_test(req, flag, tac_status_ignore); }
int tac_undefined(void) { return -32766; }
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// mpiLibNames are tried in order: Open MPI's and MPICH's runtime sonames.
// The unversioned libmpi.so exists only with the -dev packages.
var mpiLibNames = []string{"libmpi.so.40", "libmpi.so.12"}

var (
	mpiLoadOnce sync.Once
	mpiLoadErr  error
)

// loadMPI loads the MPI library once per process. Open MPI's own signal
// handlers would replace the Go runtime's (and turn a Go panic into an
// MPI abort), so they are switched off unless the user set the variable.
func loadMPI() error {
	mpiLoadOnce.Do(func() {
		if _, set := os.LookupEnv("OMPI_MCA_opal_signal"); !set {
			_ = os.Setenv("OMPI_MCA_opal_signal", "")
		}
		var tried []string
		for _, name := range mpiLibNames {
			cname := C.CString(name)
			missing := C.tac_mpi_open(cname)
			C.free(unsafe.Pointer(cname))
			if missing == nil {
				return
			}
			if m := C.GoString(missing); m != "dlopen" {
				mpiLoadErr = fmt.Errorf("comm: %s has no %s: not a usable MPI library", name, m)
				return
			}
			tried = append(tried, C.GoString(C.tac_dlerror()))
		}
		mpiLoadErr = fmt.Errorf("comm: the mpi backend needs Open MPI or MPICH installed (libopenmpi3 / libmpich12 on Debian): %v", tried)
	})
	return mpiLoadErr
}

// mpiError turns an MPI return code into an error with MPI's own message.
func mpiError(rc C.int) error {
	if rc == 0 {
		return nil
	}
	var buf [512]C.char
	C.tac_errstr(rc, &buf[0], C.int(len(buf)))
	return fmt.Errorf("MPI error %d: %s", int(rc), C.GoString(&buf[0]))
}

func mpiDType(dt tensor.DType) C.int {
	switch dt {
	case tensor.Float64:
		return 1
	case tensor.Int32:
		return 2
	case tensor.BFloat16, tensor.Float16:
		return 3 // their bit patterns; reductions widen first (mpiWide)
	}
	return 0
}

func mpiOp(op ReduceOp) C.int {
	switch op {
	case Max:
		return 1
	case Min:
		return 2
	}
	return 0 // sum; avg is a sum divided afterwards
}

// bufPtr is the address of b's first byte (nil for an empty buffer). The
// buffers are tensor storage that the operation keeps referenced until MPI
// completes; Go's collector does not move heap memory.
func bufPtr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

var errMPIFinalized = errors.New("MPI was finalized in this process; it cannot start again")
