package launch

import (
	"errors"
	"syscall"
)

// probeGroups asks the kernel whether each group has any member left: signal
// 0 checks for existence without delivering anything.
func probeGroups(pgids map[int]bool) map[int]bool {
	live := map[int]bool{}
	for g := range pgids {
		if err := syscall.Kill(-g, 0); !errors.Is(err, syscall.ESRCH) {
			live[g] = true
		}
	}
	return live
}
