//go:build !cgo || !linux

package comm

import "errors"

// Without cgo (or off Linux) there is no way to load an MPI library; the
// backend name still exists so the error says what to change.
func init() {
	RegisterBackend("mpi", func(EnvInfo, Options) (Group, error) {
		return nil, errors.New("comm: the mpi backend needs a Linux build with cgo (CGO_ENABLED=1); use comm.backend=tcp")
	})
}
