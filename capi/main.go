// Command capi is tinyacc's C ABI, built as a shared library:
//
//	go build -buildmode=c-shared -o build/libtinyacc.so ./capi
//
// The contract, documented for callers in tinyacc.h:
//
//   - Objects (configs, models, optimizers, data loaders, trainer sessions,
//     losses) cross the boundary as opaque int64 handles into a registry, so
//     no Go pointer ever reaches the caller and a stale or forged handle is a
//     lookup failure instead of a crash.
//   - Caller memory is passed as pointer + element count and is read or
//     written only while the call runs; nothing keeps it afterwards, except
//     buffers the caller registers (buckets.go), which stay borrowed until
//     their handle is freed.
//   - Every function returns an int status: 0 on success, a negative
//     TINYACC_ERR_* kind on failure, with the message available from
//     tinyacc_last_error() on the same thread. Panics are recovered in every
//     export and turned into TINYACC_ERR_INTERNAL.
//
// Each export is a thin wrapper that converts C arguments and calls a Go
// function with Go types (api*.go); the tests exercise those directly.
package main

/*
#include <stddef.h>
#include <stdint.h>
void tinyacc_err_set(const char *msg, size_t n);
const char *tinyacc_err_get(void);
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime/debug"
	"unsafe"
)

// Version is the library's release, reported by tinyacc_version.
const Version = "0.1.0"

// ABIVersion changes whenever an exported signature or a status code
// changes meaning; tinyacc.h carries the same number.
const ABIVersion = 5

// Status codes; tinyacc.h mirrors them as TINYACC_OK and TINYACC_ERR_*.
const (
	statusOK       = 0
	errInvalidArg  = -1  // a null pointer, a negative count, a bad enum value
	errBadHandle   = -2  // unknown, freed, or of the wrong kind
	errConfig      = -3  // the configuration is invalid
	errSize        = -4  // a caller buffer does not match the expected size
	errIO          = -5  // reading or writing a file failed
	errState       = -6  // the call is out of order (backward twice, step before prepare)
	errComm        = -7  // a collective or the process group failed
	errRuntime     = -8  // the engine reported an error (see the message)
	errUnsupported = -9  // valid but not implemented yet
	errInternal    = -10 // a bug: a recovered panic
)

// apiError is an error with the status code it maps to.
type apiError struct {
	code int
	err  error
}

func (e *apiError) Error() string { return e.err.Error() }
func (e *apiError) Unwrap() error { return e.err }

// fail builds an error of the given kind with a formatted message.
func fail(code int, format string, args ...any) error {
	return &apiError{code: code, err: fmt.Errorf(format, args...)}
}

// wrap attaches a status code to an existing error, keeping its text.
func wrap(code int, err error) error {
	if err == nil {
		return nil
	}
	var ae *apiError
	if errors.As(err, &ae) {
		return err
	}
	return &apiError{code: code, err: err}
}

// codeOf maps any error to a status; errors without a kind come from the
// engine and are reported as TINYACC_ERR_RUNTIME.
func codeOf(err error) int {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.code
	}
	return errRuntime
}

// setError stores msg as this thread's last error.
func setError(msg string) {
	if msg == "" {
		msg = "unknown error"
	}
	b := []byte(msg)
	C.tinyacc_err_set((*C.char)(unsafe.Pointer(&b[0])), C.size_t(len(b)))
}

// call runs fn, converting its error or panic into a status code and this
// thread's last error. Every export goes through it, so nothing unwinds
// into C.
func call(fn func() error) (status C.int) {
	defer func() {
		if r := recover(); r != nil {
			setError(fmt.Sprintf("tinyacc: internal error: %v\n%s", r, debug.Stack()))
			status = errInternal
		}
	}()
	if err := fn(); err != nil {
		setError(err.Error())
		return C.int(codeOf(err))
	}
	return statusOK
}

// lastError reads this thread's last error (for tests, which cannot use
// cgo themselves).
func lastError() string { return C.GoString(C.tinyacc_err_get()) }

var versionC = C.CString(Version)

//export tinyacc_version
func tinyacc_version() *C.char { return versionC }

//export tinyacc_abi_version
func tinyacc_abi_version() C.int { return ABIVersion }

//export tinyacc_last_error
func tinyacc_last_error() *C.char { return (*C.char)(unsafe.Pointer(C.tinyacc_err_get())) }

//export tinyacc_free
func tinyacc_free(h C.int64_t) C.int {
	return call(func() error { return freeHandle(int64(h)) })
}

func main() {}
