package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// TestInjectorSkipsDeadMaster checks that a fault on the Sentinel's master
// acts on a master that answers, and is skipped with its reason, not
// failed, while the sentinels still name a master that is gone: seeds
// 320025 and 320036 sent a CLIENT KILL to the master a failover had just
// killed (a sentinel not yet told of the failover named it), and counted
// the refused connection as the checker's own violation.
func TestInjectorSkipsDeadMaster(t *testing.T) {
	b := &backend{top: Sentinel, sentinel: redistest.StartSentinel(t)}
	s := &Scenario{Topology: Sentinel, Faults: []Fault{{Kind: FaultClientKill}}}
	in := newInjector(s, b, nil, nil)

	w, skipped := in.run(time.Now())
	if len(w) != 1 || w[0].err != "" || len(skipped) != 0 {
		t.Fatalf("with the master up, the CLIENT KILL gave %+v, skipped %q, want it injected", w, skipped)
	}

	// The sentinels notice a master down after 1 s: until then they all
	// name the one just stopped.
	b.sentinel.Master().Stop()
	w, skipped = in.run(time.Now())
	if len(w) != 0 {
		t.Fatalf("with the master gone, the CLIENT KILL gave %+v, want it skipped, not injected", w)
	}
	if len(skipped) != 1 || !strings.Contains(skipped[0], "redis-client-kill") || !strings.Contains(skipped[0], "no master answers") {
		t.Fatalf("skipped %q, want the fault and its reason: no master answers", skipped)
	}
}
