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
// returns what happened. It runs on the caller's goroutine.
func (in *injector) run(start time.Time) []window {
	var out []window
	for i, f := range in.s.Faults {
		time.Sleep(time.Until(start.Add(f.At)))
		srv := in.targets[i]
		if in.b.top == Sentinel {
			srv = in.master() // after a failover, the new master
		}
		w := window{kind: f.Kind, start: time.Now()}
		if err := in.inject(f, srv); err != nil {
			w.err = err.Error()
		}
		w.end = time.Now()
		out = append(out, w)
	}
	return out
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

// master returns the Sentinel's master as a sentinel reports it, or the
// master resolved before the load when none answers.
func (in *injector) master() *redistest.Server {
	for _, st := range in.b.sentinel.Sentinels() {
		v, err := st.Do("SENTINEL", "get-master-addr-by-name", in.b.sentinel.MasterName())
		if err != nil {
			continue
		}
		addr := strings.Join(strings.Fields(v), ":")
		for _, d := range in.b.sentinel.DataNodes() {
			if d.Addr == addr {
				return d
			}
		}
	}
	return in.targets[0]
}

// waitFailover waits until a sentinel reports a master other than old, and
// that master says so.
func (in *injector) waitFailover(old string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, st := range in.b.sentinel.Sentinels() {
			v, err := st.Do("SENTINEL", "get-master-addr-by-name", in.b.sentinel.MasterName())
			if err != nil {
				continue
			}
			addr := strings.Join(strings.Fields(v), ":")
			if addr == old {
				continue
			}
			for _, d := range in.b.sentinel.DataNodes() {
				if d.Addr == addr {
					if info, err := d.Do("INFO", "replication"); err == nil && strings.Contains(info, "role:master") {
						return nil
					}
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("no failover away from the killed master within %s", timeout)
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
