//go:build unix && !linux

package launch

import "syscall"

// rankProcAttr puts each rank in its own process group, so that one kill
// reaches everything the rank started, and keeps the launcher's terminal
// signals (Ctrl-C) from reaching ranks directly: the launcher forwards them
// itself and then knows to wait.
func rankProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// liveGroups reports which of the given process groups still have a member.
// Without /proc, zombies count as members, which at worst makes a stop wait
// out its grace period, and a stopped member cannot be told from a running
// one (none is reported frozen).
func liveGroups(pgids map[int]bool) (live, frozen map[int]bool) {
	return probeGroups(pgids), map[int]bool{}
}
