package chaos

import (
	"fmt"
	"strings"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// Redis settings of every scenario: a timeout generous enough for a busy
// machine (a decision that times out without a fault would be a fallback
// nobody asked for), and a short breaker cooldown so that the fleet comes
// back soon after a fault.
const (
	redisTimeout    = 150 * time.Millisecond
	redisMaxWait    = time.Second
	breakerCooldown = 250 * time.Millisecond
)

// backend is the Redis of a scenario, started: what the nodes are told,
// and the servers faults act on.
type backend struct {
	top      Topology
	single   *redistest.Server
	cluster  *redistest.Cluster
	sentinel *redistest.Sentinel
}

// startBackend starts the Redis of topology top (nothing for Memory).
func startBackend(t redistest.T, top Topology) *backend {
	b := &backend{top: top}
	switch top {
	case Single:
		b.single = redistest.Start(t, "--enable-debug-command", "yes")
	case Cluster:
		b.cluster = redistest.StartCluster(t, 3, "--enable-debug-command", "yes")
	case Sentinel:
		b.sentinel = redistest.StartSentinel(t)
	}
	return b
}

// block is the `redis { ... }` block of the site, empty for Memory.
func (b *backend) block() string {
	var addr string
	switch b.top {
	case Single:
		addr = "address " + b.single.Addr
	case Cluster:
		addr = "address " + strings.Join(b.cluster.Addrs(), " ")
	case Sentinel:
		addr = fmt.Sprintf("sentinel %s %s", b.sentinel.MasterName(), strings.Join(b.sentinel.SentinelAddrs(), " "))
	default:
		return ""
	}
	return fmt.Sprintf("\t\tredis {\n\t\t\t%s\n\t\t\ttimeout %s\n\t\t\tmax_wait %s\n\t\t\tbreaker_cooldown %s\n\t\t}\n",
		addr, dur(redisTimeout), dur(redisMaxWait), dur(breakerCooldown))
}

// server returns the data server a fault numbered i acts on: the single
// server, the i-th master of a Cluster (mod 3), the Sentinel's master.
func (b *backend) server(i int) *redistest.Server {
	switch b.top {
	case Single:
		return b.single
	case Cluster:
		nodes := b.cluster.Nodes()
		return nodes[i%len(nodes)]
	case Sentinel:
		return b.sentinel.Master()
	}
	return nil
}

// servers returns every data server, to read keys from.
func (b *backend) servers() []*redistest.Server {
	switch b.top {
	case Single:
		return []*redistest.Server{b.single}
	case Cluster:
		return b.cluster.Nodes()
	case Sentinel:
		return []*redistest.Server{b.sentinel.Master()}
	}
	return nil
}
