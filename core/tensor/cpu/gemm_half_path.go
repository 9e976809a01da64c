package cpu

import (
	"os"
	"sync"
	"sync/atomic"
)

// BF16KernelEnv names the environment variable that turns the bf16
// kernel off: TINYACC_BF16_KERNEL=off makes bf16 products take the
// portable path (the one every CPU without AVX512-BF16 takes) on a CPU
// that has the kernel, so that path can be measured and tested there.
// It is read once, at start; "on" or unset keeps the kernel where the CPU
// has it.
const BF16KernelEnv = "TINYACC_BF16_KERNEL"

// bf16Kernel says bf16 products run the kernel of gemm_bf16.c: the CPU
// and build have it (bf16Native) and it is not turned off.
var bf16Kernel atomic.Bool

func init() { bf16Kernel.Store(bf16Native && os.Getenv(BF16KernelEnv) != "off") }

// SetBF16Kernel turns the bf16 kernel on or off for the products that
// start afterwards and returns the previous setting; on has no effect
// where the CPU or build has no kernel. `tinyacc bench step` uses it for
// its bf16-portable rows.
func SetBF16Kernel(on bool) (was bool) {
	return bf16Kernel.Swap(on && bf16Native)
}

// The portable path's float32 operands live in buffers reused from product
// to product: every element is written before the product reads it, so a
// buffer need not be allocated (and zeroed, and faulted in) per product.
var widenPool sync.Pool

// getWidenBuf returns a buffer of n float32s from widenPool, contents
// unspecified; putWidenBuf gives it back (nil: nothing to give back).
func getWidenBuf(n int) *[]float32 {
	if v, ok := widenPool.Get().(*[]float32); ok && cap(*v) >= n {
		*v = (*v)[:n]
		return v
	}
	b := make([]float32, n)
	return &b
}

func putWidenBuf(b *[]float32) {
	if b != nil {
		widenPool.Put(b)
	}
}
