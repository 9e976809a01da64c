//go:build !linux

package process

import "syscall"

// pluginProcAttr is nil: only Linux kills a child when its parent dies
// (Pdeathsig), so a plugin's process outlives a rank killed elsewhere.
func pluginProcAttr() *syscall.SysProcAttr { return nil }
