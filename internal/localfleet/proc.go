package localfleet

import (
	"errors"
	"fmt"
	"os/exec"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// proc is a process started for a test (a Caddy node, nginx), waited for
// in the background.
type proc struct {
	name   string      // what failures call it: "caddy", "nginx"
	log    *SyncBuffer // its output
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited (its ProcessState is set)
}

// startProc starts cmd with its output in log, to die with this process
// where the system allows (sysProcAttr); name is what failures call it.
func startProc(name string, cmd *exec.Cmd, log *SyncBuffer) (proc, error) {
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return proc{}, fmt.Errorf("starting %s: %v", name, err)
	}
	p := proc{name: name, log: log, cmd: cmd, exited: make(chan struct{})}
	go func(cmd *exec.Cmd, exited chan struct{}) {
		_ = cmd.Wait()
		close(exited)
	}(p.cmd, p.exited)
	return p, nil
}

// readyTimeout bounds how long a process may take to serve its
// configuration.
const readyTimeout = 20 * time.Second

// waitReady polls ready every 50 ms until it reports true. It fails the
// test with the process's output at once when the process exits, or when
// ready has not reported true within readyTimeout, late then saying what
// the process did not do.
func (p *proc) waitReady(t redistest.T, ready func() bool, late func() string) {
	t.Helper()
	if err := p.awaitReady(ready, late); err != nil {
		t.Fatal(err)
	}
}

// errExitedAtStart is awaitReady's error when the process ended before
// it was ready.
var errExitedAtStart = errors.New("exited at start")

// awaitReady is waitReady's wait, returning what went wrong.
func (p *proc) awaitReady(ready func() bool, late func() string) error {
	deadline := time.NewTimer(readyTimeout)
	defer deadline.Stop()
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	for !ready() {
		select {
		case <-p.exited:
			return fmt.Errorf("%s %w (%v); its output:\n%s", p.name, errExitedAtStart, p.cmd.ProcessState, p.log.String())
		case <-deadline.C:
			return fmt.Errorf("%s; its output:\n%s", late(), p.log.String())
		case <-poll.C:
		}
	}
	return nil
}

// stop kills the process and waits for it. Calling it twice is harmless.
func (p *proc) stop() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
	p.cmd = nil
}
