package launch

import (
	"fmt"
	"runtime"
)

// ranksPerCore is how many ranks per core still rendezvous comfortably:
// every rank starts a process, loads its data and connects to every other
// rank, all within the communication deadline.
const ranksPerCore = 4

// oversubscribed returns a warning when nproc ranks on this host's cores
// are unlikely to finish their rendezvous in time, or "".
func oversubscribed(nproc, cores int) string {
	if nproc <= ranksPerCore*cores {
		return ""
	}
	return fmt.Sprintf("launch: warning: %d ranks on %d cores (more than %d per core): each rank starts, loads its data and connects to all %d others (%d connections in all) before the deadline (comm.timeout); expect the rendezvous to time out, or use fewer ranks",
		nproc, cores, ranksPerCore, nproc-1, nproc*(nproc-1)/2)
}

// warnOversubscribed logs oversubscribed's warning for this host, if any.
func warnOversubscribed(nproc int, out *output) {
	if w := oversubscribed(nproc, runtime.NumCPU()); w != "" {
		out.log(w)
	}
}
