package process

import "syscall"

// pluginProcAttr has the kernel kill a plugin's process when the rank
// that started it dies without a chance to stop it (Pdeathsig).
func pluginProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
