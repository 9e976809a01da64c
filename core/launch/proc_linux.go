package launch

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
)

// rankProcAttr puts each rank in its own process group, so that one kill
// reaches everything the rank started, and keeps the launcher's terminal
// signals (Ctrl-C) from reaching ranks directly: the launcher forwards them
// itself and then knows to wait. Pdeathsig stops a rank if the launcher
// itself is killed without a chance to clean up.
func rankProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// liveGroups reports which of the given process groups still have a running
// member, and which have a member that cannot run: stopped (SIGSTOP, a
// terminal's stop) or held by a tracer. It reads /proc rather than probing
// with kill(-pgid, 0) because an orphaned grandchild that died stays a zombie
// member of its group until init reaps it, and some inits never do; a zombie
// has stopped and must not make the launcher wait out the whole grace period.
func liveGroups(pgids map[int]bool) (live, frozen map[int]bool) {
	live, frozen = map[int]bool{}, map[int]bool{}
	dir, err := os.ReadDir("/proc")
	if err != nil {
		return probeGroups(pgids), frozen
	}
	for _, e := range dir {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue // not a process
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited while we looked
		}
		state, pgrp, ok := parseStat(stat)
		if ok && pgids[pgrp] && state != 'Z' && state != 'X' {
			live[pgrp] = true
			if state == 'T' || state == 't' {
				frozen[pgrp] = true
			}
		}
	}
	return live, frozen
}

// parseStat extracts the state and process group from /proc/PID/stat. The
// command name is in parentheses and may itself contain spaces or ')', so
// fields are counted from the last ')'.
func parseStat(stat []byte) (state byte, pgrp int, ok bool) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := bytes.Fields(stat[i+1:]) // state ppid pgrp ...
	if len(f) < 3 || len(f[0]) != 1 {
		return 0, 0, false
	}
	pgrp, err := strconv.Atoi(string(f[2]))
	if err != nil {
		return 0, 0, false
	}
	return f[0][0], pgrp, true
}
