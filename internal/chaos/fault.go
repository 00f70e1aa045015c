package chaos

import (
	"fmt"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/localfleet"
	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// window is a fault as it happened: its kind and when it started and
// ended, by this machine's clock.
type window struct {
	kind       string
	start, end time.Time
	err        string // what went wrong injecting it, if anything
}

// redisFault reports whether a fault of kind keeps Redis from deciding
// (so that zones fall back to their on_error), and not only a node.
func redisFault(kind string) bool {
	switch kind {
	case FaultReload, FaultNodeKill:
		return false
	}
	return true
}

// dataLoss reports whether a fault of kind may lose buckets: a Redis
// restarted empty, a replica promoted before it had every write.
func dataLoss(kind string) bool { return kind == FaultKill || kind == FaultFailover }

// injector injects a scenario's faults into its fleet.
type injector struct {
	s      *Scenario
	b      *backend
	nodes  []*localfleet.Node
	reload func(n *localfleet.Node, gen int) error
	gen    int
	// targets are the data servers the faults act on, resolved before
	// the load (the Sentinel's master is asked once).
	targets []*redistest.Server
}

// newInjector resolves the servers the scenario's faults act on.
func newInjector(s *Scenario, b *backend, nodes []*localfleet.Node, reload func(*localfleet.Node, int) error) *injector {
	in := &injector{s: s, b: b, nodes: nodes, reload: reload}
	for _, f := range s.Faults {
		in.targets = append(in.targets, b.server(f.Node))
	}
	return in
}

// run injects the faults at their times from start, each to its end, and
// returns what happened: the faults injected, and a line for each fault
// skipped and why. It runs on the caller's goroutine.
func (in *injector) run(start time.Time) (out []window, skipped []string) {
	for i, f := range in.s.Faults {
		time.Sleep(time.Until(start.Add(f.At)))
		srv := in.targets[i]
		if in.b.top == Sentinel && onServer(f.Kind) {
			// After a failover, the new master. A fault on a master that
			// is gone would be no fault, and injecting it no failure of
			// the fleet: it is skipped, and said.
			m, err := in.master("")
			if err != nil {
				skipped = append(skipped, fmt.Sprintf("%s at %s skipped: %v", f.Kind, time.Now().Format("15:04:05.000"), err))
				continue
			}
			srv = m
		}
		w := window{kind: f.Kind, start: time.Now()}
		if err := in.inject(f, srv); err != nil {
			w.err = err.Error()
		}
		w.end = time.Now()
		out = append(out, w)
	}
	return out, skipped
}

// onServer reports whether a fault of kind acts on a data server (and not
// on a node or the machine).
func onServer(kind string) bool {
	switch kind {
	case FaultReload, FaultNodeKill, FaultStress:
		return false
	}
	return true
}

// inject injects one fault and returns when it is over.
func (in *injector) inject(f Fault, srv *redistest.Server) error {
	switch f.Kind {
	case FaultPause:
		srv.Pause()
		time.Sleep(f.For)
		srv.Resume()
	case FaultKill:
		srv.Stop()
		time.Sleep(f.For)
		srv.Restart() // empty: its buckets and script cache are gone
	case FaultClientKill:
		if _, err := srv.Do("CLIENT", "KILL", "TYPE", "normal"); err != nil {
			return fmt.Errorf("CLIENT KILL: %w", err)
		}
	case FaultDebugSleep:
		if _, err := srv.Do("DEBUG", "SLEEP", fmt.Sprintf("%.3f", f.For.Seconds())); err != nil {
			return fmt.Errorf("DEBUG SLEEP: %w", err)
		}
	case FaultFailover:
		old := srv.Addr
		srv.Stop()
		return in.waitFailover(old, 20*time.Second)
	case FaultReload:
		in.gen++
		return in.reload(in.nodes[f.Node], in.gen)
	case FaultNodeKill:
		n := in.nodes[f.Node]
		n.Kill9()
		time.Sleep(200 * time.Millisecond)
		return n.Restart()
	case FaultStress:
		return stress(f.For)
	}
	return nil
}

// master returns the Sentinel's master: a data server that a sentinel
// names as the master (other than skip) and that says it is one. A
// sentinel not yet told of a failover still names the master it killed;
// master asks the next one. It fails, saying what each sentinel named,
// when no master answers.
func (in *injector) master(skip string) (*redistest.Server, error) {
	var named []string
	for _, st := range in.b.sentinel.Sentinels() {
		v, err := st.Do("SENTINEL", "get-master-addr-by-name", in.b.sentinel.MasterName())
		if err != nil {
			named = append(named, fmt.Sprintf("sentinel %s: %v", st.Addr, err))
			continue
		}
		addr := strings.Join(strings.Fields(v), ":")
		if addr == skip {
			named = append(named, fmt.Sprintf("sentinel %s names %s, the old master", st.Addr, addr))
			continue
		}
		for _, d := range in.b.sentinel.DataNodes() {
			if d.Addr != addr {
				continue
			}
			info, err := d.Do("INFO", "replication")
			if err == nil && strings.Contains(info, "role:master") {
				return d, nil
			}
			if err == nil {
				err = fmt.Errorf("not a master")
			}
			named = append(named, fmt.Sprintf("sentinel %s names %s: %v", st.Addr, addr, err))
		}
	}
	return nil, fmt.Errorf("no master answers (%s)", strings.Join(named, "; "))
}

// waitFailover waits until a master other than old answers (see master).
func (in *injector) waitFailover(old string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		_, err := in.master(old)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no failover away from the killed master within %s: %w", timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stress keeps every CPU busy with stress-ng for d. stress-ng and its
// workers are in a process group of their own, killed as one.
func stress(d time.Duration) error {
	if _, err := exec.LookPath("stress-ng"); err != nil {
		return fmt.Errorf("stress-ng is needed for the CPU fault and is not on PATH (apt-get install stress-ng): %w", err)
	}
	cmd := exec.Command("stress-ng", "--cpu", fmt.Sprint(runtime.NumCPU()), "--quiet")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting stress-ng: %w", err)
	}
	time.Sleep(d)
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	_ = cmd.Wait()
	return nil
}
