package redistest

import "syscall"

// sysProcAttr makes a server die with the test binary, so that a test that
// times out or panics (and so runs no cleanup) leaves no redis-server
// behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
