package localfleet

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Pid returns the process id of the running Caddy, or 0 when it is not
// running.
func (n *Node) Pid() int {
	if n.proc.cmd == nil || n.proc.cmd.Process == nil {
		return 0
	}
	return n.proc.cmd.Process.Pid
}

// Kill9 kills the process with SIGKILL, as an operator's kill -9 or the
// kernel's OOM killer would, and waits for it to exit. Its ports stay the
// node's: Restart starts it again on them.
func (n *Node) Kill9() {
	if n.proc.cmd == nil || n.proc.cmd.Process == nil {
		return
	}
	_ = n.proc.cmd.Process.Signal(syscall.SIGKILL)
	<-n.proc.exited
	n.proc.cmd = nil
}

// Restart starts the node again with its last configuration, on the same
// ports, after Kill9 or Stop, and waits until it serves. Unlike StartNode it
// reports a failure as an error, so that it may run outside the test's
// goroutine (a fault injected during a load).
func (n *Node) Restart() error {
	n.Kill9()
	cmd := exec.Command(n.bin, "run", "--config", n.cfgPath, "--adapter", "caddyfile")
	cmd.Env = append(append(os.Environ(), "HOME="+n.t.TempDir()), n.env...)
	p, err := startProc("caddy", cmd, n.Log)
	if err != nil {
		return err
	}
	n.proc = p
	deadline := time.Now().Add(readyTimeout)
	for !n.ready() {
		select {
		case <-p.exited:
			return fmt.Errorf("caddy exited on restart (%v)", p.cmd.ProcessState)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("caddy did not become ready again within %s", readyTimeout)
		}
	}
	return nil
}
