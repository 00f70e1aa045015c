package localfleet

import "syscall"

// sysProcAttr makes a Caddy node die with the process that started it, so
// that a test binary that times out or crashes (and so runs no cleanup)
// leaves no node behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
