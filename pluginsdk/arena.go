package pluginsdk

import (
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/tinyacc/tinyacc/core/tensor"
)

// Arena is a shared-memory region both the host and a plugin process map:
// the parameters, their gradients and the buffers a plugin allocates in
// Prepare live here, so no tensor crosses the RPC connection.
type Arena struct {
	Path string // the backing file while it exists ("" once removed)
	mem  []byte
	f32  []float32
}

// ShmDir is where arena files are made.
var ShmDir = "/dev/shm"

var arenaSeq atomic.Int64

// ArenaPattern is the glob of the arena files of host process pid.
func ArenaPattern(pid int) string {
	return filepath.Join(ShmDir, fmt.Sprintf("tinyacc-%d-*", pid))
}

// CreateArena makes and maps a zeroed arena of size bytes (a multiple of 4)
// named tinyacc-<pid>-<n>-<what>. Pages are allocated when first written.
func CreateArena(size int64, what string) (*Arena, error) {
	path := filepath.Join(ShmDir, fmt.Sprintf("tinyacc-%d-%d-%s", os.Getpid(), arenaSeq.Add(1), what))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("plugin arena: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("plugin arena: sizing %s to %d bytes: %w", path, size, err)
	}
	a, err := mapFile(f, size)
	if err != nil {
		os.Remove(path)
		return nil, err
	}
	a.Path = path
	return a, nil
}

// OpenArena maps the arena file at path, which holds size bytes.
func OpenArena(path string, size int64) (*Arena, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("plugin arena: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("plugin arena: %w", err)
	}
	if st.Size() != size {
		return nil, fmt.Errorf("plugin arena: %s holds %d bytes, the host said %d", path, st.Size(), size)
	}
	return mapFile(f, size)
}

func mapFile(f *os.File, size int64) (*Arena, error) {
	if size <= 0 || size%4 != 0 {
		return nil, fmt.Errorf("plugin arena: size %d is not a positive multiple of 4", size)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("plugin arena: mapping %s (%d bytes): %w", f.Name(), size, err)
	}
	return &Arena{mem: mem, f32: unsafe.Slice((*float32)(unsafe.Pointer(&mem[0])), len(mem)/4)}, nil
}

// Remove deletes the backing file; the mappings stay valid.
func (a *Arena) Remove() {
	if a.Path != "" {
		os.Remove(a.Path)
		a.Path = ""
	}
}

// Close removes the file and unmaps the arena; tensors on it must no
// longer be used.
func (a *Arena) Close() error {
	a.Remove()
	if a.mem == nil {
		return nil
	}
	err := syscall.Munmap(a.mem)
	a.mem, a.f32 = nil, nil
	return err
}

// Bytes is the arena's size.
func (a *Arena) Bytes() int64 { return int64(len(a.mem)) }

// F32 returns n float32 elements at byte offset off as a tensor of shape.
func (a *Arena) F32(off int64, shape ...int) (*tensor.Tensor, error) {
	n := int64(tensor.Numel(shape))
	if off < 0 || off%4 != 0 || off+4*n > int64(len(a.mem)) {
		return nil, fmt.Errorf("plugin arena: %d float32 at byte %d do not fit the arena's %d bytes", n, off, len(a.mem))
	}
	i := off / 4
	return tensor.FromF32(a.f32[i:i+n:i+n], shape...), nil
}

// Offset is the byte offset of the float32 elements of t in the arena, and
// false when they lie elsewhere.
func (a *Arena) Offset(t *tensor.Tensor) (int64, bool) {
	if t == nil || t.DType() != tensor.Float32 || !t.HasStorage() || t.Numel() == 0 || len(a.mem) == 0 {
		return 0, false
	}
	p := uintptr(unsafe.Pointer(&t.F32()[0]))
	base := uintptr(unsafe.Pointer(&a.mem[0]))
	if p < base || p+uintptr(4*t.Numel()) > base+uintptr(len(a.mem)) {
		return 0, false
	}
	return int64(p - base), true
}

// bump hands out the arena's free bytes from off upwards (Prepare's
// allocations in a plugin process).
type bump struct {
	a   *Arena
	off int64
	err error
}

func (b *bump) alloc(dt tensor.DType, n int) any {
	if dt != tensor.Float32 {
		return nil // the heap: only float32 buffers are shared
	}
	need := int64(4 * n)
	if b.off+need > b.a.Bytes() {
		if b.err == nil {
			b.err = fmt.Errorf("the plugin allocated more than the arena's %d bytes in Prepare", b.a.Bytes())
		}
		return nil
	}
	i := b.off / 4
	b.off += (need + 63) &^ 63
	return b.a.f32[i : i+int64(n) : i+int64(n)]
}
